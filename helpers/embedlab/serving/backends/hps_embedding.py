"""Triton python-backend model `hps_embedding`: embedding lookup through `embedlab.hps`.

Copied as `<repository>/hps_embedding/1/model.py` by `embedlab.serving.write_model_repository`.
Inputs KEYS (INT64 [batch, keys_per_sample]) and NUMKEYS (INT32 [batch, 1], the number of keys
of each sample, as HugeCTR's HPS backend takes); outputs OUTPUT0 (FP32 [batch,
keys_per_sample, emb_vec_size]) and DEFAULTED_KEYS (INT32 [batch, 1]: how many keys of each
sample no tier holds, answered with the table's default vector). The parameter server is built
from the HPS JSON named in the config's parameters, once per model instance; the requests of one
dynamic batch are looked up in one call. The HPS statistics are published on Triton's metrics
endpoint as the gauge `embedlab_hps_stat{model=..., instance=..., stat=...}` by a thread of
their own (`embedlab.serving._metrics.StatsPublisher`), off the request path: on every scrape of
a server started by `embedlab.serving.TritonServer`, else at most 0.25 s after they change.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from embedlab.serving._checks import check_keys
from embedlab.serving._metrics import REFRESH_DIR_ENV, StatsPublisher

_STATS_PERIOD_S = 0.25


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        for need in ("ps_config_file", "hps_model_name", "table_id", "keys_per_sample", "emb_vec_size"):
            if need not in params:
                raise pb_utils.TritonModelException(
                    f"hps_embedding: config.pbtxt parameter {need!r} is missing")
        self.model_name = params["hps_model_name"]
        self.table_id = int(params["table_id"])
        self.keys_per_sample = int(params["keys_per_sample"])
        self.dim = int(params["emb_vec_size"])
        self.max_batch_size = int(config["max_batch_size"])
        from embedlab.hps import ParameterServer   # no TensorFlow: keeps the stub light
        self.ps = ParameterServer(params["ps_config_file"])
        try:
            info = self.ps.table_info(self.model_name, self.table_id)
        except Exception as e:
            raise pb_utils.TritonModelException(
                f"hps_embedding: {params['ps_config_file']} does not serve model {self.model_name!r} "
                f"table {self.table_id}: {e}") from None
        if int(info["dim"]) != self.dim:
            raise pb_utils.TritonModelException(
                f"hps_embedding: the HPS table {info.get('name')} has dim {info['dim']}, but config.pbtxt "
                f"says emb_vec_size {self.dim}")
        self._family = pb_utils.MetricFamily(
            name="embedlab_hps_stat", description="embedlab.hps ParameterServer.stats() entries",
            kind=pb_utils.MetricFamily.GAUGE)
        instance = args.get("model_instance_name", "")    # each instance has its own ParameterServer
        self._publisher = StatsPublisher(
            self.ps.stats,
            lambda stat: self._family.Metric(labels={"model": self.model_name, "instance": instance, "stat": stat}),
            refresh_dir=os.environ.get(REFRESH_DIR_ENV) or None, period_s=_STATS_PERIOD_S)
        if self._publisher.error:
            pb_utils.Logger.log_warn(f"hps_embedding: statistics refresh on scrape is off, they are "
                                     f"published every {_STATS_PERIOD_S} s: {self._publisher.error}")

    def execute(self, requests):
        responses = [None] * len(requests)
        good, key_blocks = [], []
        for i, request in enumerate(requests):
            keys = pb_utils.get_input_tensor_by_name(request, "KEYS")
            numkeys = pb_utils.get_input_tensor_by_name(request, "NUMKEYS")
            keys = keys.as_numpy() if keys is not None else None
            numkeys = numkeys.as_numpy() if numkeys is not None else None
            problem = check_keys(keys, numkeys, self.keys_per_sample, self.max_batch_size,
                                 "KEYS (ensemble input EMB_KEY)", "NUMKEYS (ensemble input EMB_N_KEY)")
            if problem:
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"hps_embedding: {problem}"))
                continue
            good.append(i)
            key_blocks.append(keys)
        if good:
            flat = np.concatenate([k.reshape(-1) for k in key_blocks]) if len(key_blocks) > 1 \
                else key_blocks[0].reshape(-1)
            try:
                vectors, defaulted = self.ps.lookup(self.model_name, self.table_id, flat, return_defaulted=True)
            except Exception as e:  # a lookup failure fails these requests, not the server
                for i in good:
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"hps_embedding: lookup failed: {e}"))
            else:
                start = 0
                for i, keys in zip(good, key_blocks):
                    n = keys.size
                    out = vectors[start:start + n].reshape(keys.shape[0], self.keys_per_sample, self.dim)
                    per_sample = defaulted[start:start + n].reshape(keys.shape[0], self.keys_per_sample)
                    start += n
                    responses[i] = pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(out)),
                        pb_utils.Tensor("DEFAULTED_KEYS",
                                        per_sample.sum(axis=1, dtype=np.int32).reshape(-1, 1))])
        return responses

    def finalize(self):
        self._publisher.close()     # before the metric family and the server go
        self.ps.close()
