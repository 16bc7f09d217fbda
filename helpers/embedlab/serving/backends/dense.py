"""Triton python-backend model `dense`: the ONNX dense model run with onnxruntime.

Copied as `<repository>/dense/1/model.py` by `embedlab.serving.write_model_repository`.
Input LOOKUP_VECTORS (FP32 [batch, keys_per_sample, emb_vec_size], the embedding model's
output), output DENSE_OUTPUT (FP32 [batch, 1]). The vectors are reshaped to the ONNX model's
input shape (tf2onnx's `[batch, slot_num * emb_vec_size]`), so the reshape HugeCTR's sample
wraps around its TensorFlow dense model is not needed. The tritonserver in `nvidia-pytriton`
bundles no onnxruntime backend, hence this python model.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from embedlab.serving._checks import check_vectors


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        for need in ("onnx_file", "onnx_input", "onnx_output", "keys_per_sample", "emb_vec_size"):
            if need not in params:
                raise pb_utils.TritonModelException(f"dense: config.pbtxt parameter {need!r} is missing")
        self.tail = (int(params["keys_per_sample"]), int(params["emb_vec_size"]))
        self.max_batch_size = int(config["max_batch_size"])
        path = params["onnx_file"]
        if not os.path.isfile(path):
            raise pb_utils.TritonModelException(f"dense: ONNX file {path} does not exist")
        threads = int(params.get("intra_op_num_threads", "1"))
        # Batches below this many samples run on a single-threaded session: waking a pool of
        # threads costs more than it saves there, and it is the tail of batch-1 latency.
        self.small_batch = int(params.get("single_thread_below", "64"))

        def session(n_threads):
            so = ort.SessionOptions()
            so.intra_op_num_threads = n_threads
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            # No spin-waiting: on a small machine the server, the HPS stub and this stub share
            # the cores, and a spinning pool thread steals them.
            so.add_session_config_entry("session.intra_op.allow_spinning", params.get("allow_spinning", "0"))
            return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])

        try:
            self.session = session(threads)
            self.small_session = session(1) if threads > 1 else self.session
        except Exception as e:
            raise pb_utils.TritonModelException(f"dense: onnxruntime cannot load {path}: {e}") from None
        names = {i.name: i for i in self.session.get_inputs()}
        self.input_name, self.output_name = params["onnx_input"], params["onnx_output"]
        if self.input_name not in names:
            raise pb_utils.TritonModelException(
                f"dense: {path} has no input {self.input_name!r} (it has {sorted(names)})")
        outs = [o.name for o in self.session.get_outputs()]
        if self.output_name not in outs:
            raise pb_utils.TritonModelException(
                f"dense: {path} has no output {self.output_name!r} (it has {outs})")
        shape = names[self.input_name].shape
        width = int(np.prod(self.tail))
        static = [d for d in shape[1:]]
        if any(not isinstance(d, int) for d in static) or int(np.prod(static)) != width:
            raise pb_utils.TritonModelException(
                f"dense: {path} input {self.input_name!r} has shape {shape}; expected [batch, ...] with "
                f"{width} values per sample ({self.tail[0]} keys x {self.tail[1]})")
        if isinstance(shape[0], int):
            raise pb_utils.TritonModelException(
                f"dense: {path} input {self.input_name!r} has a fixed batch of {shape[0]}; export it "
                "with a free batch dimension (tf2onnx input_signature with shape [None, ...])")
        self.onnx_tail = tuple(static)

    def execute(self, requests):
        responses = [None] * len(requests)
        good, blocks = [], []
        for i, request in enumerate(requests):
            t = pb_utils.get_input_tensor_by_name(request, "LOOKUP_VECTORS")
            v = t.as_numpy() if t is not None else None
            problem = check_vectors(v, self.tail, self.max_batch_size)
            if problem:
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"dense: {problem}"))
                continue
            good.append(i)
            blocks.append(v)
        if good:
            x = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
            x = x.reshape((x.shape[0],) + self.onnx_tail)
            try:
                sess = self.small_session if x.shape[0] < self.small_batch else self.session
                y = sess.run([self.output_name], {self.input_name: x})[0]
            except Exception as e:
                for i in good:
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"dense: onnxruntime failed: {e}"))
            else:
                y = np.asarray(y, dtype=np.float32).reshape(x.shape[0], -1)
                start = 0
                for i, v in zip(good, blocks):
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("DENSE_OUTPUT",
                                                        np.ascontiguousarray(y[start:start + v.shape[0]]))])
                    start += v.shape[0]
        return responses
