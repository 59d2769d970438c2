# Source on a GPU host before running tvm_canary from this checkout:  source scripts/gpu-env.sh
# TVM comes from the Python environment (pip install -e ".[test,cuda]"), or, on a host without network,
# from an optional unpacked folder .gpu-bundle/ whose activate.sh puts TVM on the path (docs/gpu-validation.md).
# Also makes libcudart.so.13 from the nvidia-* wheels visible, without which TVM silently reports no CUDA
# device. Returns non-zero when TVM sees no CUDA device.
if [ -f .gpu-bundle/activate.sh ]; then source .gpu-bundle/activate.sh; fi
_nv=$(python3 -c "import glob, os, site; print(':'.join(sorted(glob.glob(os.path.join(site.getsitepackages()[0], 'nvidia', '*', 'lib')) + glob.glob(os.path.join(site.getsitepackages()[0], 'nvidia', 'cu*', 'lib')))))")
export LD_LIBRARY_PATH="${_nv}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TVM_CANARY_CACHE="${TVM_CANARY_CACHE:-/tmp/tvm_canary_cache}"
unset _nv
python3 -c "import sys, tvm, torch
if not tvm.cuda(0).exist: sys.exit('gpu-env: TVM sees no CUDA device (no GPU, or libcudart.so.13 not found)')
print('tvm', tvm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
