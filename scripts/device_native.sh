# Sourced ON the lent GPU by the scripts that run the lab natively (device_bench.sh, device_retrieval.sh,
# device_training.sh): `native_env` unpacks the Vulkan loader from .gl/, installs the wheels of .whl/ into /tmp/site
# (scripts/device_bench_prepare.sh makes both here), points Python and Vulkan at them and the NVIDIA driver, and
# writes the GPU's name to $OUT/gpu.txt. Returns 4 when the wheels do not install.
native_env() {
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 4
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
}
