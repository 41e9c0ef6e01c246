"""Host-side tools, CPython only: the native wgpu-py backend, the numpy reference, the CLI, benchmarks,
synthetic models and the model fetcher. The browser's wheel ships everything in lab/ except this package
(server/wheel.py), so nothing here may be imported by the engine."""
