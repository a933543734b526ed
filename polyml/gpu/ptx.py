"""NVPTX modules to PTX text with LLVM's NVPTX back end (in-process, through llvmlite), and
``ptxas`` as the assembler that checks the PTX is valid for a given SM."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import llvmlite.binding as llvm
import llvmlite.ir as ir

from polyml.errors import ToolchainError
from polyml.gpu import DEFAULT_SM, TRIPLE

#: PTX ISA version per SM generation (LLVM's NVPTX feature names)
PTX_FEATURES = {"sm_70": "+ptx64", "sm_75": "+ptx64", "sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78",
                "sm_90": "+ptx78", "sm_90a": "+ptx80", "sm_100": "+ptx86", "sm_120": "+ptx87"}


@functools.cache
def target_machine(sm: str = DEFAULT_SM) -> llvm.TargetMachine:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(TRIPLE)
    except RuntimeError as e:
        raise ToolchainError(f"this LLVM (llvmlite) has no NVPTX target: {e}") from None
    return target.create_target_machine(cpu=sm, features=PTX_FEATURES.get(sm, ""), opt=3)


def to_ptx(module: ir.Module, sm: str = DEFAULT_SM) -> str:
    """Verify, optimize (O3) and compile one NVPTX module to PTX."""
    tm = target_machine(sm)
    try:
        mod = llvm.parse_assembly(str(module))
        mod.verify()
    except RuntimeError as e:
        raise ToolchainError(f"{module.name}: invalid NVPTX IR: {e}") from None
    mod.triple = TRIPLE
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


def ptxas() -> str | None:
    return shutil.which("ptxas")


def assemble(ptx: Path, sm: str = DEFAULT_SM, out: Path | None = None) -> None:
    """Assemble ``ptx`` with ``ptxas -arch=<sm>`` (to ``out`` or nowhere); raise on errors."""
    exe = ptxas()
    if exe is None:
        raise ToolchainError("ptxas not found (install the CUDA toolkit's ptxas to check PTX)")
    cmd = [exe, f"-arch={sm}", str(ptx), "-o", str(out) if out else "/dev/null"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise ToolchainError(f"ptxas failed on {ptx}: {proc.stderr.strip()}")


__all__ = ["assemble", "ptxas", "to_ptx", "target_machine"]
