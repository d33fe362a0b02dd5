"""tinygrad's NULL device (allocates nothing, runs nothing) rendering the CUDA kernels a GPU would run, on a machine
without the CUDA toolchain: a CUDA renderer whose compiler keeps the source. Run under DEV=NULL:CUDA:<arch> (e.g.
sm_90, an H100); compile in this process (PARALLEL=0: a pool process would not find this renderer)."""
from tinygrad import Device
from tinygrad.device import Compiler
from tinygrad.renderer import cstyle

SOURCES: list[str] = []  # every kernel's CUDA source, in the order they were compiled


class _SourceOnly(Compiler):
    def compile(self, src: str) -> bytes:
        SOURCES.append(src)
        return src.encode()


class CUDARenderer(cstyle.CUDARenderer):  # the class name the NULL device selects for DEV=NULL:CUDA:<arch>
    def __init__(self, target, use_nvcc=False):
        cstyle.CStyleLanguage.__init__(self, target)
        self.compiler, self.tensor_cores = _SourceOnly(), cstyle.tc.get_cuda(target.arch)


def use_source_only_cuda() -> None:
    """Makes DEV=NULL:CUDA:<arch> render with CUDARenderer (before the device's renderer is first asked for)."""
    assert Device.DEFAULT == "NULL", Device.DEFAULT
    Device["NULL"].renderers = [CUDARenderer, *Device["NULL"].renderers]
