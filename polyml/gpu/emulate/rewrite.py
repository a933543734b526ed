"""NVPTX kernel IR → host IR for the emulator: the same instructions, with the device's special
registers, shared memory and barriers supplied by the emulated grid, and every memory access
bounds-checked.

The input is a kernel module exactly as :mod:`polyml.gpu.builder` writes it (llvmlite's text,
``kernels/<op>.ll`` of a CUDA artifact: one ``define`` per kernel, one instruction per line).
Per kernel function ``K(bufs...)``:

* ``K`` gets a last parameter ``ctx``: the emulated thread's context (``runtime.c``'s
  ``emu_thread``).  ``llvm.nvvm.read.ptx.sreg.{tid,ntid,ctaid,nctaid}.{x,y,z}`` become loads of
  the thread's coordinates from it (once, in the entry block: a thread's coordinates are fixed);
* every ``addrspace(3)`` global the kernel uses becomes a slice of the per-block shared buffer
  (``ctx->shared``; offsets 16-byte aligned, in order of first use): one buffer per block in flight;
* ``llvm.nvvm.barrier0`` becomes ``polyml_emu_barrier(ctx, site)``: the thread (a fibre) waits
  until every thread of its block has reached a barrier (``runtime.c`` reports a barrier that not
  all of them reach);
* each ``load``/``store`` is preceded by ``polyml.emu.check(p, bytes, lo, hi, guard, ctx, site)``:
  the address must lie in the array its pointer is derived from (followed through ``gep``,
  ``bitcast``, ``select`` and ``phi``): a kernel argument (``[lo, hi)`` is the argument's slot,
  set per launch from the manifest's slot table, so an access into a neighbouring tensor of the
  same arena is caught), one shared array, or a global of the module (``polyml_status``, the
  word index checks set, which the runtime defines and reads after each launch).  A predicated access ``select(pred, &A[..],
  &dummy)`` (a guard turned into a predicate, the dummy a thread-private ``alloca``) checks
  ``&A[..]`` when ``pred`` holds (``guard``); accesses of private slots only are not checked;
* an exported wrapper ``K__emu(void **args, void *ctx)`` calls ``K`` with the buffer pointers.

Other functions the module defines must be unused (the outlined GEMM helper after inlining) and
are dropped.  The result is compiled at ``-O2`` (the check inlines to a compare and a cold
branch); :class:`Rewritten` describes each kernel (barriers, shared bytes) and each check site.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from polyml.errors import EmulationError

SREGS = ("tid", "ntid", "ctaid", "nctaid")
AXES = "xyz"
#: byte offsets of the fields of ``emu_thread`` (runtime.c) the kernels read
CTX_SREG, CTX_SHARED, CTX_BOUNDS = 0, 48, 56

NAME = r'(?:%"(?:[^"\\]|\\.)*"|%[-\w.$]+|@"(?:[^"\\]|\\.)*"|@[-\w.$]+)'
_DEF = re.compile(rf"^\s+({NAME}) = (.*)$")
_DEFINE = re.compile(r'^define (?P<pre>.*?)@(?P<name>"[^"]*"|[-\w.$]+)\((?P<args>.*)\)(?P<post>[^()]*)$')
_SREG = re.compile(r'call i32 @"?llvm\.nvvm\.read\.ptx\.sreg\.(tid|ntid|ctaid|nctaid)\.([xyz])"?\(\)')
_BARRIER = re.compile(r'^(\s+)call void @"?llvm\.nvvm\.barrier0"?\(\)\s*$')
_SHARED_GLOBAL = re.compile(rf'^({NAME}) = (?:internal |private )?addrspace\(3\) global \[(\d+) x (float|i32|i64)\] .*$')
_PTR_OPERAND = re.compile(rf',\s*(?P<ty>[^,]*?)\*\s+(?P<ptr>{NAME})(?:\s+(?:syncscope\("[^"]*"\)\s+)?'
                          r'(?:unordered|monotonic|acquire|release|acq_rel|seq_cst))?\s*(?:,\s*align\s+\d+)?\s*$')
_GLOBAL = re.compile(rf'^({NAME}) = (?:[a-z_]+ )*global (\[[^\]]*\]|<[^>]*>|[\w]+)')
_GEP = re.compile(rf'^getelementptr (?:inbounds )?(?:nuw |nusw )?.+?, [^,]+?\*\s+(?P<base>{NAME})')
_BITCAST = re.compile(rf'^bitcast [^,]+?\*\s+(?P<src>{NAME}) to ')
_SELECT = re.compile(rf'^select\s+i1 [^,]+, [^,]+?\*\s+(?P<a>{NAME}), [^,]+?\*\s+(?P<b>{NAME})\s*$')
_PHI = re.compile(r'^phi\s+[^\[]+?\*\s+(?P<rest>\[.*)$')
_PHI_IN = re.compile(rf'\[\s*(?P<v>{NAME}|null)\s*,')
_TYPE_SIZE = {"float": 4, "i32": 4, "i64": 8}

#: alignment of each shared array in the per-block buffer
SHARED_ALIGN = 16


@dataclass
class Site:
    """One checked access (``kind`` load/store) or barrier of a kernel."""

    kernel: str
    kind: str  # "load" | "store" | "barrier"
    array: str  # "arg<i>" (a kernel argument) | "shared:<global>" | ""
    line: int  # line of the instruction in the kernel IR file (1-based)


@dataclass
class KernelInfo:
    name: str
    nargs: int
    barriers: int
    shared_bytes: int
    shared: dict[str, tuple[int, int]] = field(default_factory=dict)  # global -> (offset, bytes)
    #: the buffer parameter names in order (``in0``, ``out0``, ``temp0``...)
    params: list[str] = field(default_factory=list)


@dataclass
class Rewritten:
    """A host module: its text, its kernels and the check/barrier sites (indexed by site id)."""

    text: str
    kernels: dict[str, KernelInfo]
    sites: list[Site]


def _fail(module: str, line: int, what: str) -> EmulationError:
    return EmulationError(f"emulated CUDA: cannot emulate {module} line {line}: {what}")


def _unquote(name: str) -> str:
    return name[2:-1] if name[1:2] == '"' else name[1:]


def _size_expr(ty: str) -> str:
    """``sizeof(ty)`` as an LLVM constant expression."""
    return f"ptrtoint ({ty}* getelementptr ({ty}, {ty}* null, i32 1) to i64)"


def _functions(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line indices of every ``define ... { ... }``."""
    out, start = [], None
    for i, ln in enumerate(lines):
        if ln.startswith("define "):
            start = i
        elif ln.startswith("}") and start is not None:
            out.append((start, i))
            start = None
    return out


def kernel_names(text: str) -> list[str]:
    """The functions ``!nvvm.annotations`` marks as kernels."""
    return [_unquote(m.group(1)) for m in re.finditer(rf'({NAME}), !"kernel", i32 1', text)]


def rewrite_module(text: str, module: str = "module") -> Rewritten:
    """The host module of one NVPTX kernel module (see the module docstring)."""
    lines = text.split("\n")
    kernels = set(kernel_names(text))
    shared_globals: dict[str, int] = {}
    globals_: dict[str, str] = {}  # other module globals (``polyml_status``): name -> type
    for ln in lines:
        m = _SHARED_GLOBAL.match(ln)
        if m:
            shared_globals[m.group(1)] = int(m.group(2)) * _TYPE_SIZE[m.group(3)]
        elif (g := _GLOBAL.match(ln)) is not None:
            globals_[g.group(1)] = g.group(2)
    out: list[str] = []
    infos: dict[str, KernelInfo] = {}
    sites: list[Site] = []
    funcs = _functions(lines)
    bodies = {i: j for i, j in funcs}
    defined: dict[str, tuple[int, int]] = {}
    for i, j in funcs:
        m = _DEFINE.match(lines[i])
        if m is None:
            raise _fail(module, i + 1, "unrecognized function definition")
        defined[m.group("name").strip('"')] = (i, j)
    i = 0
    while i < len(lines):
        ln = lines[i]
        if i in bodies:
            j = bodies[i]
            name = _DEFINE.match(ln).group("name").strip('"')
            if name in kernels:
                info, body = _rewrite_kernel(lines, i, j, name, module, shared_globals, globals_, sites)
                infos[name] = info
                out.extend(body)
            else:
                refs = [k for k, (a, b) in defined.items() if k != name and
                        any(f'@"{name}"' in lines[x] or f"@{name}(" in lines[x] for x in range(a, b + 1))]
                if refs:
                    raise _fail(module, i + 1, f"kernel {refs[0]} calls function {name}")
            i = j + 1
            continue
        if (ln.startswith("target ") or _SHARED_GLOBAL.match(ln) or ln.startswith("!nvvm.annotations")
                or re.match(r'^declare .*@"?llvm\.nvvm\.', ln)):
            i += 1
            continue
        out.append(ln)
        i += 1
    out.append(_RUNTIME_DECLS)
    return Rewritten("\n".join(out) + "\n", infos, sites)


_RUNTIME_DECLS = """
declare void @"polyml_emu_barrier"(i8*, i32)
declare void @"polyml_emu_fault"(i8*, i32, i8*, i64, i8*, i8*) noreturn nounwind cold

define internal void @"polyml.emu.check"(i8* %p, i64 %n, i8* %lo, i8* %hi, i1 %guard, i8* %ctx, i32 %site) alwaysinline nounwind
{
entry:
  br i1 %guard, label %range, label %ok
range:
  %pi = ptrtoint i8* %p to i64
  %li = ptrtoint i8* %lo to i64
  %hl = ptrtoint i8* %hi to i64
  %end = add i64 %pi, %n
  %below = icmp ult i64 %pi, %li
  %above = icmp ugt i64 %end, %hl
  %bad = or i1 %below, %above
  br i1 %bad, label %fault, label %ok, !prof !{!"branch_weights", i32 1, i32 1048576}
fault:
  call void @"polyml_emu_fault"(i8* %ctx, i32 %site, i8* %p, i64 %n, i8* %lo, i8* %hi)
  unreachable
ok:
  ret void
}
"""


def _params(args: str) -> list[tuple[str, str]]:
    """(type, name) of each parameter of a ``define`` line (llvmlite's formatting)."""
    out = []
    for part in re.split(r",\s*(?=[^,]*%)", args):
        part = part.strip()
        if not part:
            continue
        m = re.match(rf"^(?P<ty>.+?)(?:\s+(?:noalias|nocapture|readonly|writeonly|nonnull|noundef))*\s+(?P<name>{NAME})$", part)
        if m is None:
            raise EmulationError(f"emulated CUDA: unrecognized kernel parameter {part!r}")
        out.append((m.group("ty"), m.group("name")))
    return out


def _rewrite_kernel(lines: list[str], first: int, last: int, name: str, module: str, shared_globals: dict[str, int],
                    globals_: dict[str, str], sites: list[Site]) -> tuple[KernelInfo, list[str]]:
    m = _DEFINE.match(lines[first])
    params = _params(m.group("args"))
    arg_index = {n: k for k, (_, n) in enumerate(params)}
    body = lines[first + 1:last]
    defs: dict[str, tuple[str, int]] = {}
    for k, ln in enumerate(body):
        d = _DEF.match(ln)
        if d:
            defs[d.group(1)] = (d.group(2).strip(), first + 2 + k)

    memo: dict[str, frozenset[str]] = {}

    def roots(v: str, depth: int = 0) -> frozenset[str]:
        """The arrays pointer ``v`` may point into: ``arg<i>``, a shared global, ``alloca:<v>``
        or ``?`` (unknown)."""
        if v in memo:
            return memo[v]
        if depth > 200:
            return frozenset({"?"})
        memo[v] = frozenset()  # a phi cycle contributes nothing new
        if v in arg_index:
            r = frozenset({f"arg{arg_index[v]}"})
        elif v in shared_globals:
            r = frozenset({f"shared:{v}"})
        elif v in globals_:
            r = frozenset({f"global:{v}"})
        elif v in defs:
            rhs = defs[v][0]
            if rhs.startswith("alloca "):
                r = frozenset({f"alloca:{v}"})
            elif (g := _GEP.match(rhs)) is not None:
                r = roots(g.group("base"), depth + 1)
            elif (g := _BITCAST.match(rhs)) is not None:
                r = roots(g.group("src"), depth + 1)
            elif (g := _SELECT.match(rhs)) is not None:
                r = roots(g.group("a"), depth + 1) | roots(g.group("b"), depth + 1)
            elif (g := _PHI.match(rhs)) is not None:
                r = frozenset().union(*(roots(x.group("v"), depth + 1) for x in _PHI_IN.finditer(g.group("rest"))
                                       if x.group("v") != "null"))
            else:
                r = frozenset({"?"})
        else:
            r = frozenset({"?"})
        memo[v] = r
        return r

    # shared arrays this kernel uses, laid out in order of first use
    used_shared: dict[str, tuple[int, int]] = {}
    top = 0
    for ln in body:
        for g in re.findall(r'@"[^"]*"|@[-\w.$]+', ln):
            if g in shared_globals and g not in used_shared:
                used_shared[g] = (top, shared_globals[g])
                top += -(-shared_globals[g] // SHARED_ALIGN) * SHARED_ALIGN

    ctx = '%"__emu.ctx"'
    entry: list[str] = []
    # the thread's coordinates, read once
    sreg_vals: dict[tuple[str, str], str] = {}
    for ln in body:
        for reg, ax in _SREG.findall(ln):
            sreg_vals.setdefault((reg, ax), f'%"__emu.{reg}.{ax}"')
    for (reg, ax), v in sorted(sreg_vals.items()):
        off = CTX_SREG + 4 * (3 * SREGS.index(reg) + AXES.index(ax))
        base = v[:-1]  # '%"__emu.tid.x' without its closing quote
        entry += [f'  {base}.p" = getelementptr i8, i8* {ctx}, i64 {off}',
                  f'  {base}.q" = bitcast i8* {base}.p" to i32*',
                  f'  {v} = load i32, i32* {base}.q"']
    shared_base = '%"__emu.smem"'
    if used_shared:
        entry += [f'  %"__emu.smem.pp" = getelementptr i8, i8* {ctx}, i64 {CTX_SHARED}',
                  '  %"__emu.smem.pq" = bitcast i8* %"__emu.smem.pp" to i8**',
                  f'  {shared_base} = load i8*, i8** %"__emu.smem.pq"']
        for k, (g, (off, nbytes)) in enumerate(used_shared.items()):
            ety = re.search(r'x (float|i32|i64)\]', next(ln for ln in lines if ln.startswith(g + " ="))).group(1)
            elems = shared_globals[g] // _TYPE_SIZE[ety]
            entry += [f'  %"__emu.sh{k}.lo" = getelementptr i8, i8* {shared_base}, i64 {off}',
                      f'  %"__emu.sh{k}.hi" = getelementptr i8, i8* {shared_base}, i64 {off + nbytes}',
                      f'  %"__emu.sh{k}" = bitcast i8* %"__emu.sh{k}.lo" to [{elems} x {ety}]*']
    bounds_loaded: set[int] = set()

    def arg_bounds(a: int) -> tuple[str, str]:
        if a not in bounds_loaded:
            bounds_loaded.add(a)
            if not any("__emu.bounds" in e for e in entry):
                entry.extend([f'  %"__emu.bounds.pp" = getelementptr i8, i8* {ctx}, i64 {CTX_BOUNDS}',
                              '  %"__emu.bounds.pq" = bitcast i8* %"__emu.bounds.pp" to i8***',
                              '  %"__emu.bounds" = load i8**, i8*** %"__emu.bounds.pq"'])
            for which, k in (("lo", 2 * a), ("hi", 2 * a + 1)):
                entry.extend([f'  %"__emu.a{a}.{which}.p" = getelementptr i8*, i8** %"__emu.bounds", i64 {k}',
                          f'  %"__emu.a{a}.{which}" = load i8*, i8** %"__emu.a{a}.{which}.p"'])
        return f'%"__emu.a{a}.lo"', f'%"__emu.a{a}.hi"'

    global_bounds: dict[str, tuple[str, str]] = {}

    def module_global_bounds(g: str) -> tuple[str, str]:
        """``[&g, &g + sizeof g)`` of a module global (the status word of index checks)."""
        if g not in global_bounds:
            k, ty = len(global_bounds), globals_[g]
            entry.extend([f'  %"__emu.g{k}.lo" = bitcast {ty}* {g} to i8*',
                          f'  %"__emu.g{k}.hi" = getelementptr i8, i8* %"__emu.g{k}.lo", i64 {_size_expr(ty)}'])
            global_bounds[g] = (f'%"__emu.g{k}.lo"', f'%"__emu.g{k}.hi"')
        return global_bounds[g]

    shared_names = {g: f'%"__emu.sh{k}"' for k, g in enumerate(used_shared)}
    shared_bounds = {g: (f'%"__emu.sh{k}.lo"', f'%"__emu.sh{k}.hi"') for k, g in enumerate(used_shared)}

    new_body: list[str] = []
    barriers = 0
    tmp = 0
    for k, ln in enumerate(body):
        lineno = first + 2 + k
        if _BARRIER.match(ln):
            sites.append(Site(name, "barrier", "", lineno))
            new_body.append(f'  call void @"polyml_emu_barrier"(i8* {ctx}, i32 {len(sites) - 1})')
            barriers += 1
            continue
        stripped = ln.strip()
        d = _DEF.match(ln)
        rhs = d.group(2).strip() if d else stripped
        kind = "load" if rhs.startswith("load ") else "store" if rhs.startswith("store ") else None
        if kind is not None:
            pm = _PTR_OPERAND.search(rhs)
            if pm is None:
                raise _fail(module, lineno, f"unrecognized {kind}: {stripped}")
            ptr, pty = pm.group("ptr"), pm.group("ty").replace(" addrspace(3)", "").strip()
            rs = roots(ptr)
            private = {r for r in rs if r.startswith("alloca:")}
            arrays = sorted(rs - private)
            if "?" in arrays or len(arrays) > 1:
                raise _fail(module, lineno, f"cannot tell which array the {kind} through {ptr} accesses "
                                            f"({', '.join(arrays) or 'none'})")
            if arrays:
                arr = arrays[0]
                if arr.startswith("arg"):
                    lo, hi = arg_bounds(int(arr[3:]))
                elif arr.startswith("global:"):
                    lo, hi = module_global_bounds(arr[len("global:"):])
                else:
                    lo, hi = shared_bounds[arr[len("shared:"):]]
                guard, target = "true", ptr
                pre = []
                if private:
                    # a predicated access: ``select(pred, &A[..], &dummy)``; check &A[..] when pred holds
                    sel = _SELECT.match(defs[ptr][0]) if ptr in defs else None
                    if sel is None:
                        raise _fail(module, lineno, f"{kind} through {ptr} may address both an array and a private slot")
                    cond = re.match(r"^select\s+i1 ([^,]+),", defs[ptr][0]).group(1).strip()
                    a_priv = all(r.startswith("alloca:") for r in roots(sel.group("a")))
                    b_priv = all(r.startswith("alloca:") for r in roots(sel.group("b")))
                    if a_priv == b_priv:
                        raise _fail(module, lineno, f"{kind} through {ptr} selects between two arrays")
                    target = sel.group("b") if a_priv else sel.group("a")
                    guard = cond
                    if a_priv:
                        guard = f'%"__emu.t{tmp}.g"'
                        pre.append(f"  {guard} = xor i1 {cond}, true")
                sites.append(Site(name, kind, arr, lineno))
                p8 = f'%"__emu.t{tmp}.p"'
                ptr_text = shared_names.get(target, target)
                pre.append(f'  {p8} = bitcast {pty}* {ptr_text} to i8*')
                pre.append(f'  call void @"polyml.emu.check"(i8* {p8}, i64 {_size_expr(pty)}, i8* {lo}, i8* {hi}, '
                           f'i1 {guard}, i8* {ctx}, i32 {len(sites) - 1})')
                tmp += 1
                new_body.extend(pre)
        ln = _SREG.sub(lambda s: f'add i32 {sreg_vals[(s.group(1), s.group(2))]}, 0', ln)
        for g, v in shared_names.items():
            ln = re.sub(rf'\[\d+ x (?:float|i32|i64)\] addrspace\(3\)\*\s+{re.escape(g)}(?=[,\s)]|$)',
                        lambda s, v=v: s.group(0).split(" addrspace(3)")[0] + "* " + v, ln)
        if "addrspace(3)" in ln:
            ln = ln.replace(" addrspace(3)", "")
        if "@\"llvm.nvvm" in ln or "@llvm.nvvm" in ln:
            raise _fail(module, lineno, f"unsupported NVVM intrinsic: {stripped}")
        new_body.append(ln)

    # the entry block: the first label line, then our loads, then the kernel's code
    label = next((x for x, ln in enumerate(new_body) if re.match(r'^\S.*:\s*$', ln)), None)
    if label is None:
        raise _fail(module, first + 1, f"kernel {name} has no entry block")
    new_body[label + 1:label + 1] = entry
    pre = m.group("pre").replace("define ", "")
    header = f'define internal {pre}@"{name}"({m.group("args")}, i8* noalias {ctx}){m.group("post")}'
    loads = []
    for k, (ty, _) in enumerate(params):
        loads += [f'  %"a{k}.p" = getelementptr i8*, i8** %"args", i64 {k}',
                  f'  %"a{k}.v" = load i8*, i8** %"a{k}.p"',
                  f'  %"a{k}" = bitcast i8* %"a{k}.v" to {ty}']
    call_args = ", ".join(f'{ty} %"a{k}"' for k, (ty, _) in enumerate(params))
    wrapper = [f'define void @"{name}__emu"(i8** noalias %"args", i8* noalias %"ctx") nounwind', "{", "entry:", *loads,
               f'  call void @"{name}"({call_args}{", " if params else ""}i8* %"ctx")', "  ret void", "}"]
    info = KernelInfo(name, len(params), barriers, top, used_shared, [_unquote(n) for _, n in params])
    return info, [header, *new_body, lines[last], *wrapper]


__all__ = ["KernelInfo", "Rewritten", "Site", "kernel_names", "rewrite_module"]
