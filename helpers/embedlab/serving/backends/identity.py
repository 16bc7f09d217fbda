"""Triton python-backend model that returns its input: the no-work ceiling of the ensemble path.

Copied as `<repository>/identity_a|identity_b/1/model.py` by
`embedlab.serving.write_identity_repository`.
"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
