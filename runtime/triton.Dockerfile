# Serving image for `serving.server: triton`: NVIDIA Triton Inference Server with its vLLM
# backend and OpenAI-compatible frontend (/opt/tritonserver/python/openai), plus the
# weights tool the init containers run. Push it to the stack's CR repository under the tag
# the stack names (stacks/Pulumi.triton-example.yaml).
#
# The vLLM version inside is the one NVIDIA ships in this release (see NVIDIA's framework
# containers support matrix); the project's kernels plugin targets vLLM 0.32's APIs and is
# not installed here.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.07-vllm-python-py3
FROM ${TRITON_IMAGE}

WORKDIR /opt/deepseek-volc
COPY runtime ./runtime
# The OpenAI frontend's requirements (python/openai/requirements.txt of the same release)
# and the TOS SDK of the weights tool; then check that both start.
RUN python3 -m pip install --no-cache-dir -r /opt/tritonserver/python/openai/requirements.txt "tos==2.9.3" \
 && python3 -c "import tos, runtime.weights" \
 && test -f /opt/tritonserver/python/openai/openai_frontend/main.py
ENV PYTHONPATH=/opt/deepseek-volc
