"""Which tinygrad devices are the host's CPU (named without tinygrad, for every process): CPU, and CLANG and LLVM,
its names in older tinygrad releases, and PYTHON, tinygrad's emulator that runs on it."""

CPU_DEVICES = ("CPU", "CLANG", "LLVM", "PYTHON")


def is_cpu_device(device: str) -> bool:
    """device: a tinygrad device name, e.g. CPU, CUDA:1."""
    return device.split(":")[0].upper() in CPU_DEVICES
