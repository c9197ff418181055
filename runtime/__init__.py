"""Code that runs inside the serving pod, shipped in the serving image (Dockerfile here).

`weights`: the init containers' tool (sync the model from TOS to the node cache, fetch
credentials for S3 clients, refuse a tokenizer that disagrees with config.json); its
stores (a directory, or the bucket through the S3 API) and their credentials are in `stores`.
`health`: the probes of a headless multi-node worker (its vLLM engine processes alive).

May import: the standard library, plus what the image carries (boto3, the TOS SDK, transformers),
imported lazily. Never the project's other packages: the image copies only `runtime/` and
`kernels/` and installs the project with --no-deps, so pulumi and pydantic are not there.
"""
