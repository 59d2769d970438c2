# Source on a GPU host that has python3 + torch (CUDA 13) but no TVM:  source scripts/gpu-env.sh
# Unpacks the TVM bundle (.gpu-bundle, made by ../shared/gpu/make-bundle.sh) and makes libcudart.so.13
# from the nvidia-* wheels visible, without which TVM silently reports no CUDA device.
source .gpu-bundle/activate.sh
_nv=$(python3 -c "import glob, os, site; print(':'.join(sorted(glob.glob(os.path.join(site.getsitepackages()[0], 'nvidia', '*', 'lib')) + glob.glob(os.path.join(site.getsitepackages()[0], 'nvidia', 'cu*', 'lib')))))")
export LD_LIBRARY_PATH="${_nv}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TVM_CANARY_CACHE="${TVM_CANARY_CACHE:-/tmp/tvm_canary_cache}"
unset _nv
python3 -c "import tvm, torch; assert tvm.cuda(0).exist, 'TVM sees no CUDA device (libcudart.so.13?)'; print('tvm', tvm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
