"""Tests of the ctypes binding: CPU backend with numpy everywhere; torch/CUDA tests when present.

Run: PKV_LIBRARY=build/libpersistentkv.so python3 -m pytest -q python/tests
"""

import ctypes
import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import persistentkv as pkv  # noqa: E402
from persistentkv import _lib  # noqa: E402

TOL = {"float16": 2e-3, "bfloat16": 1.5e-2}
SPLITTY = dict(parallelism=32, min_chunk_tokens=16)  # small chunks: every route splits and merges


# ---- helpers ------------------------------------------------------------------------------------
def seed_of(*parts):
    return zlib.crc32(repr(parts).encode())


def to_dtype(x, dtype):
    """float32 numpy -> float16 array or uint16 bf16 bits."""
    return x.astype(np.float16) if dtype == "float16" else pkv.bf16_bits(x)


def to_f64(a, dtype):
    a = np.asarray(a)
    return (pkv.bf16_to_float32(a) if dtype == "bfloat16" else a.astype(np.float32)).astype(np.float64)


def make_problem(seed, lens, hq, hkv, d=64, ps=16, layout="NHD", dtype="float16", spare_pages=7):
    """A random step with scattered page ids (and some rows holding one unused extra page)."""
    rng = np.random.default_rng(seed)
    lens = np.asarray(lens, np.int32)  # seq_lens [B]
    pages = (lens + ps - 1) // ps + rng.integers(0, 2, len(lens))
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)  # indptr [B+1]
    pool = int(indptr[-1]) + spare_pages
    indices = rng.permutation(pool)[: indptr[-1]].astype(np.int32)  # indices [nnz]
    shape = (pool, ps, hkv, d) if layout == "NHD" else (pool, hkv, ps, d)
    k = to_dtype(rng.standard_normal(shape, dtype=np.float32), dtype)
    v = to_dtype(rng.standard_normal(shape, dtype=np.float32), dtype)
    q = to_dtype(rng.standard_normal((len(lens), hq, d), dtype=np.float32), dtype)  # q [B, Hq, d]
    return dict(q=q, k=k, v=v, indptr=indptr, indices=indices, lens=lens, hq=hq, hkv=hkv, d=d, ps=ps,
                pool=pool, layout=layout, dtype=dtype)


def plan(w, p, **kw):
    kw.setdefault("q_data_type", p["dtype"])
    w.plan(p["indptr"], p["indices"], p["lens"], p["hq"], p["hkv"], p["d"], p["ps"], num_pages=p["pool"], **kw)


def ref_of(p, k=None, v=None, sm_scale=None):
    return pkv.reference(p["q"], p["k"] if k is None else k, p["v"] if v is None else v, p["indptr"],
                         p["indices"], p["lens"], kv_layout=p["layout"], sm_scale=sm_scale,
                         q_data_type=p["dtype"])


def assert_close(o, lse, ref, dtype, lens):
    ro, rl = ref
    o64 = to_f64(o, dtype)
    rel = np.linalg.norm(o64 - ro) / max(np.linalg.norm(ro), 1e-30)
    assert rel < TOL[dtype], f"rel L2 error {rel:.3g} >= {TOL[dtype]}"
    empty = np.asarray(lens) == 0
    assert np.all(o64[empty] == 0.0)
    if lse is not None:
        lse = np.asarray(lse, np.float64)
        assert np.all(np.isneginf(lse[empty])) and np.all(np.isneginf(rl[empty]))
        assert np.all(np.isfinite(lse[~empty]))
        assert np.max(np.abs(lse[~empty] - rl[~empty]), initial=0.0) < 2e-3


LENS = [0, 1, 17, 48, 130, 257, 3]


# ---- library and structs ------------------------------------------------------------------------
def test_library_loaded():
    assert os.path.exists(pkv.library_path)
    assert pkv.status_string(pkv.Status.PAGE_OUT_OF_RANGE) == "page id out of range"
    assert set(pkv.ROUTES) >= {"auto", "single", "split", "bucketed", "workqueue"}
    assert set(pkv.TRACE_FAMILIES) == {"uniform", "bimodal", "zipf", "bucketed", "homogeneous"}


def test_library_not_found_names_what_was_tried(tmp_path):
    import subprocess
    env = dict(os.environ, PKV_LIBRARY=str(tmp_path / "nope.so"))
    code = "import persistentkv"
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "LibraryNotFoundError" in r.stderr and "nope.so" in r.stderr


def test_version_is_the_cmake_projects():
    """__version__ is the loaded library's pkv_version(), and the pip package's version is read from
    CMakeLists.txt's project() line: the two must agree (CMake checks persistentkv.h against it)."""
    import re
    assert pkv.__version__ == "{}.{}.{}".format(*divmod(_lib.lib.pkv_version() // 100, 100),
                                                _lib.lib.pkv_version() % 100)
    cmakelists = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "CMakeLists.txt")
    if not os.path.exists(cmakelists):
        pytest.skip("not in a source checkout")
    with open(cmakelists) as f:
        m = re.search(r"project\(persistentkv\s+VERSION\s+([0-9.]+)", f.read())
    assert m and m.group(1) == pkv.__version__


def _import_copy(tmp_path, with_libs):
    """Imports a copy of the package placed as pip places it (outside any checkout), with or without the
    libraries in its own lib/; returns (returncode, stdout + stderr)."""
    import shutil
    import subprocess
    pkg = tmp_path / "site" / "persistentkv"
    shutil.copytree(os.path.dirname(os.path.abspath(pkv.__file__)), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "lib"))
    if with_libs:
        (pkg / "lib").mkdir()
        here = os.path.dirname(os.path.abspath(pkv.library_path))
        shutil.copy(pkv.library_path, pkg / "lib" / "libpersistentkv.so")
        shutil.copy(os.path.join(here, "libpersistentkv_lab.so"), pkg / "lib" / "libpersistentkv_lab.so")
    env = {k: v for k, v in os.environ.items() if k not in ("PKV_LIBRARY", "PKV_LAB_LIBRARY")}
    env.update(PYTHONPATH=str(tmp_path / "site"), PYTHONDONTWRITEBYTECODE="1")
    code = "import persistentkv as p; print('library', p.library_path); print('families', p.TRACE_FAMILIES)"
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_package_loads_its_own_lib_first(tmp_path):
    """As pip installs it: the package's lib/ holds both libraries, and they are what it loads."""
    rc, out = _import_copy(tmp_path, with_libs=True)
    assert rc == 0, out
    assert f"library {tmp_path / 'site' / 'persistentkv' / 'lib' / 'libpersistentkv.so'}" in out
    assert "zipf" in out  # the lab library beside it


def test_build_folders_only_from_a_checkout(tmp_path):
    """Outside a checkout the package does not look for ../build folders next to where it is installed."""
    (tmp_path / "build").mkdir()
    decoy = tmp_path / "build" / "libpersistentkv.so"  # a decoy where the old search looked
    decoy.write_bytes(b"not a library")
    rc, out = _import_copy(tmp_path, with_libs=False)
    assert str(decoy) not in out
    if rc != 0:  # nothing installed in this environment: the message says what was tried and skipped
        assert "LibraryNotFoundError" in out and "not running from one" in out, out


# sizeof / offsetof as a C program compiled against persistentkv.h prints them (x86-64 / aarch64 LP64)
C_LAYOUT = {
    _lib.Problem: (48, [0, 4, 8, 12, 16, 24, 28, 32, 36, 40, 44]),
    _lib.PageTable: (32, [0, 8, 16, 24]),
    _lib.PlanOptions: (36, [0, 4, 8, 12, 16, 20, 24, 28, 32]),
    _lib.Tensors: (96, [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 76, 80, 88]),
    _lib.AppendTensors: (136, [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 116, 120, 128]),
    _lib.Counters: (64, [0, 8, 16, 24, 32, 40, 48, 56]),
    _lib.ContextConfig: (20, [0, 4, 8, 12, 16]),
    _lib.PageFault: (16, [0, 4, 8, 12]),
    _lib.Task: (28, [0, 4, 8, 12, 16, 20, 24]),
    _lib.Merge: (16, [0, 4, 8, 12]),
    _lib.Phase: (28, [0, 4, 8, 12, 16, 20, 24]),
    _lib.RowSched: (28, [0, 4, 8, 12, 16, 20, 24]),
    _lib.TraceConfig: (40, [0, 8, 16, 20, 24, 28, 32]),
}


@pytest.mark.parametrize("struct", list(C_LAYOUT), ids=lambda s: s.__name__)
def test_struct_layout(struct):
    size, offsets = C_LAYOUT[struct]
    assert ctypes.sizeof(struct) == size
    assert [getattr(struct, f).offset for f, _ in struct._fields_] == offsets


def test_bf16_bits_round_to_nearest_even():
    """bf16_bits rounds as the library does (to nearest, ties to even), checked on known bit patterns."""
    xs = np.array([0.0, 1.0, -2.5, 3.14159, 1e-3, 65504.0, -7e30], np.float32)
    want = [0x0000, 0x3F80, 0xC020, 0x4049, 0x3A83, 0x4780, 0xF2B1]
    bits = pkv.bf16_bits(xs)
    assert [int(b) for b in bits] == want
    # ties go to the even mantissa: 1 + 2^-8 (halfway) -> 1.0, 1 + 3 x 2^-8 -> 1 + 2^-6
    ties = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], np.float32)
    assert [int(b) for b in pkv.bf16_bits(ties)] == [0x3F80, 0x3F82]
    back = pkv.bf16_to_float32(bits)
    assert [float(b) for b in back] == [float(np.array([b << 16], np.uint32).view(np.float32)[0]) for b in want]


# ---- CPU backend against the float64 reference --------------------------------------------------
@pytest.fixture(scope="module")
def cpus():
    return {lay: pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", kv_layout=lay, num_threads=2)
            for lay in ("NHD", "HND")}


@pytest.fixture(scope="module")
def cpu(cpus):
    return cpus["NHD"]


@pytest.mark.parametrize("route", pkv.ROUTES)
@pytest.mark.parametrize("group", [1, 4, 7])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("ps", [1, 16])
def test_routes_match_reference(cpus, route, group, layout, dtype, ps):
    cpu = cpus[layout]
    p = make_problem(seed_of(route, group, layout, dtype, ps), LENS, hq=2 * group, hkv=2, ps=ps,
                     layout=layout, dtype=dtype)
    plan(cpu, p, route=route, **SPLITTY)
    cpu.validate_plan()
    if route != "auto":
        assert cpu.route == route
    if route in ("split", "workqueue", "fused"):
        assert cpu.plan_info["state_slots"] > 0  # the merge path is exercised
    o, lse = cpu.run(p["q"], p["k"], p["v"], return_lse=True)
    assert o.dtype == p["q"].dtype and o.shape == p["q"].shape
    assert lse.dtype == np.float32 and lse.shape == (len(LENS), p["hq"])
    assert_close(o, lse, ref_of(p), dtype, LENS)


def test_pdl_option():
    # the library's default launches with PDL; pdl=False reaches the context (CPU: no launches to order)
    cfg = _lib.ContextConfig()
    _lib.lib.pkv_context_config_default(ctypes.byref(cfg))
    assert cfg.pdl == 1
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", num_threads=1, pdl=False)
    p = make_problem(5, LENS, hq=8, hkv=2)
    plan(w, p, route="fused", **SPLITTY)
    assert_close(w.run(p["q"], p["k"], p["v"]), None, ref_of(p), "float16", LENS)


@pytest.mark.parametrize("d", [128, 256])
def test_head_dims_default_options(cpu, d):
    p = make_problem(d, [5, 0, 300, 64], hq=8, hkv=2, d=d)
    plan(cpu, p)  # the library's own options
    o = cpu.run(p["q"], p["k"], p["v"])
    assert_close(o, None, ref_of(p), "float16", p["lens"])


def test_sm_scale_and_given_outputs(cpu):
    p = make_problem(3, LENS, hq=8, hkv=2)
    plan(cpu, p, route="split", sm_scale=0.05, **SPLITTY)
    out = np.full(p["q"].shape, np.nan, np.float16)
    lse = np.full((len(LENS), 8), np.nan, np.float32)
    o2, l2 = cpu.run(p["q"], p["k"], p["v"], out=out, lse=lse, return_lse=True)
    assert o2 is out and l2 is lse
    assert_close(out, lse, ref_of(p, sm_scale=0.05), "float16", LENS)
    # lse given without return_lse: still written, only o returned
    lse[:] = 0
    assert cpu.run(p["q"], p["k"], p["v"], lse=lse) is not None and np.isneginf(lse[0]).all()


def test_one_plan_two_layers_and_determinism(cpu):
    p = make_problem(11, LENS, hq=8, hkv=2, ps=16)
    rng = np.random.default_rng(12)
    k2 = rng.standard_normal(p["k"].shape, dtype=np.float32).astype(np.float16)
    v2 = rng.standard_normal(p["v"].shape, dtype=np.float32).astype(np.float16)
    plan(cpu, p, route="workqueue", **SPLITTY)
    ws, route = cpu.workspace_size, cpu.route
    o1 = cpu.run(p["q"], p["k"], p["v"])   # layer 0
    o2 = cpu.run(p["q"], k2, v2)           # layer 1, same plan
    assert cpu.workspace_size == ws and cpu.route == route  # run never grows the workspace
    assert_close(o1, None, ref_of(p), "float16", LENS)
    assert_close(o2, None, ref_of(p, k2, v2), "float16", LENS)
    assert np.array_equal(cpu.run(p["q"], p["k"], p["v"]), o1)  # bitwise identical rerun


def test_run_again_with_the_same_tensors(cpu):
    """run() skips its checks for tensors it checked before (every layer, every step): what it reads and writes
    must still follow the current plan and the tensors' current contents, and a changed tensor is checked again."""
    p = make_problem(21, LENS, hq=8, hkv=2)
    rng = np.random.default_rng(22)
    k2 = to_dtype(rng.standard_normal(p["k"].shape, dtype=np.float32), "float16")
    v2 = to_dtype(rng.standard_normal(p["v"].shape, dtype=np.float32), "float16")
    out = np.full(p["q"].shape, np.nan, np.float16)
    plan(cpu, p, route="split", **SPLITTY)
    for _ in range(2):  # two layers' caches, twice each: the second round from the memo
        assert cpu.run(p["q"], p["k"], p["v"], out=out) is out
        assert_close(out, None, ref_of(p), "float16", LENS)
        out[:] = np.nan
        cpu.run(p["q"], k2, v2, out=out)
        assert_close(out, None, ref_of(p, k2, v2), "float16", LENS)
        out[:] = np.nan
    # fresh views of the same memory (a model makes q anew at every layer) are the same arguments: one memo entry
    for _ in range(3):
        cpu.run(p["q"][:], p["k"][:], p["v"], out=out[:])
        assert_close(out, None, ref_of(p), "float16", LENS)
        out[:] = np.nan
    assert len(cpu._run_memo) == 1  # the two layers' caches differ only in their addresses: one entry
    # other arrays of the same shapes at other addresses (a model's new QKV output at every layer): the memo's
    # arguments with these addresses, not the first ones'
    for _ in range(2):
        q2, k3, out2 = p["q"].copy(), p["k"].copy(), np.full(p["q"].shape, np.nan, np.float16)
        cpu.run(q2, k3, p["v"], out=out2)
        assert_close(out2, None, ref_of(p), "float16", LENS)
        q2[:] = 0  # an input the memo's first call never saw: its own result
        cpu.run(q2, k3, p["v"], out=out2)
        assert_close(out2, None, ref_of(dict(p, q=q2)), "float16", LENS)
    assert len(cpu._run_memo) == 1
    # new contents of the same arrays are read
    p["q"][:] = to_dtype(rng.standard_normal(p["q"].shape, dtype=np.float32), "float16")
    cpu.run(p["q"], p["k"], p["v"], out=out)
    assert_close(out, None, ref_of(p), "float16", LENS)
    # a new plan (other lengths and pages, the same pool and tensors): the new plan's page ids are used
    lens2 = np.array([5, 0, 200, 31, 64, 1, 90], np.int32)
    pages2 = (lens2 + p["ps"] - 1) // p["ps"]
    indptr2 = np.concatenate([[0], np.cumsum(pages2)]).astype(np.int32)
    p2 = dict(p, lens=lens2, indptr=indptr2, indices=rng.permutation(p["pool"])[: indptr2[-1]].astype(np.int32))
    plan(cpu, p2, route="workqueue", **SPLITTY)
    out[:] = np.nan
    cpu.run(p["q"], p["k"], p["v"], out=out)
    assert_close(out, None, ref_of(p2), "float16", lens2)
    # a plan of another batch: the same q no longer fits and is refused, not read as before
    p3 = make_problem(24, [7, 9], hq=8, hkv=2)
    plan(cpu, p3)
    with pytest.raises(ValueError, match="q has shape"):
        cpu.run(p["q"], p["k"], p["v"], out=out)
    # a read-only out, which was writable when first checked, is refused
    plan(cpu, p, route="split", **SPLITTY)
    cpu.run(p["q"], p["k"], p["v"], out=out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cpu.run(p["q"], p["k"], p["v"], out=out)


def test_run_memo_keeps_no_tensor_alive(cpu):
    """Outputs made per call (a new out each time) are not held by run()'s memo."""
    import gc
    import weakref
    p = make_problem(26, LENS, hq=8, hkv=2)
    plan(cpu, p, route="split", **SPLITTY)
    refs = []
    for _ in range(3):
        out = np.empty(p["q"].shape, np.float16)
        cpu.run(p["q"], p["k"], p["v"], out=out)
        refs.append(weakref.ref(out))
        del out
    gc.collect()
    assert all(r() is None for r in refs)


def test_run_memo_sees_a_tensor_changed_in_place(cpu):
    """A torch tensor resized or re-strided in place keeps its id: run() checks it again."""
    torch = pytest.importorskip("torch")
    p = make_problem(25, LENS, hq=8, hkv=2)
    plan(cpu, p, route="split", **SPLITTY)
    q, k, v = (torch.from_numpy(p[n].copy()) for n in ("q", "k", "v"))
    out = torch.empty(q.shape, dtype=torch.float16)
    for _ in range(2):
        cpu.run(q, k, v, out=out)
        assert_close(out.numpy(), None, ref_of(p), "float16", LENS)
    out.resize_(q.shape[0] - 1, q.shape[1], q.shape[2])
    with pytest.raises(ValueError, match="out has shape"):
        cpu.run(q, k, v, out=out)
    big = torch.empty((q.shape[0], 2 * q.shape[1], q.shape[2]), dtype=torch.float16)
    out.set_(big.untyped_storage(), 0, q.shape, (2 * q.shape[1] * q.shape[2], q.shape[2], 1))  # rows 2x apart
    cpu.run(q, k, v, out=out)
    assert_close(out.numpy(), None, ref_of(p), "float16", LENS)


def test_cpu_half_loads_bitwise_either_way(cpu, tmp_path):
    """The CPU backend converts fp16 K, V and q by F16C where the CPU has it, else by a table: the same bits
    (exact conversions), so o is bitwise the same in a process that turns F16C off (PKV_TUNING=cpu_f16c=0) -
    subnormal, largest, negative-zero and infinite halves included (inf in V only: the rows stay finite
    where the table's are)."""
    import subprocess
    code = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import persistentkv as pkv
rng = np.random.default_rng(21)
pool, ps, hkv, d, hq, lens = 40, 16, 2, 64, 8, np.array([300, 17, 129], np.int32)
pages = (lens + ps - 1) // ps
indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
indices = rng.permutation(pool)[: indptr[-1]].astype(np.int32)
k = rng.standard_normal((pool, ps, hkv, d), dtype=np.float32).astype(np.float16)
v = rng.standard_normal((pool, ps, hkv, d), dtype=np.float32).astype(np.float16)
special = np.array([6e-8, -6e-8, 1e-5, 65504.0, -0.0, 2.0 ** -14], np.float16)
k.reshape(-1)[::97] = np.resize(special, k.reshape(-1)[::97].shape)
v.reshape(-1)[::89] = np.resize(np.append(special, np.float16(np.inf)), v.reshape(-1)[::89].shape)
q = rng.standard_normal((3, hq, d), dtype=np.float32).astype(np.float16)
w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", num_threads=2)
w.plan(indptr, indices, lens, hq, hkv, d, ps, num_pages=pool, q_data_type="float16", route="split",
       parallelism=8, min_chunk_tokens=16)
o, lse = w.run(q, k, v, return_lse=True)
np.save(sys.argv[2], np.concatenate([np.asarray(o).view(np.uint16).reshape(-1).astype(np.uint32),
                                     np.asarray(lse, np.float32).view(np.uint32).reshape(-1)]))
"""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    outs = []
    for i, extra in enumerate(({}, {"PKV_TUNING": "cpu_f16c=0"})):
        f = tmp_path / f"o{i}.npy"
        env = dict(os.environ, **extra)
        r = subprocess.run([sys.executable, "-c", code, here, str(f)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs.append(np.load(f))
    assert np.array_equal(outs[0], outs[1])


def test_workspace_grows_in_plan():
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", num_threads=1, workspace_bytes=1024)
    assert w.workspace_size >= 1024 and w.route is None and w.counters is None
    small = make_problem(1, [3], hq=4, hkv=1)
    plan(w, small, route="single")
    before = w.workspace_size
    big = make_problem(2, [2000] * 4, hq=16, hkv=4)
    plan(w, big, route="split", num_splits=8)
    assert w.workspace_size >= w.plan_workspace_size > before
    c = w.counters
    assert c["total_tokens"] == 8000 and c["tasks"] >= 4 * 4 and set(c) >= {"launches", "kv_bytes", "merges"}
    assert_close(w.run(big["q"], big["k"], big["v"]), None, ref_of(big), "float16", big["lens"])


def test_table_inputs_lists_and_inferred_pool(cpu):
    p = make_problem(5, [4, 0, 33], hq=4, hkv=2)
    cpu.plan(p["indptr"].tolist(), p["indices"].tolist(), p["lens"].tolist(), 4, 2, 64, 16)  # no num_pages
    assert_close(cpu.run(p["q"], p["k"], p["v"]), None, ref_of(p), "float16", p["lens"])


def test_last_page_len_as_flashinfer(cpu):
    """FlashInfer's last_page_len by keyword plans the same lengths as seq_lens (exact tables)."""
    lens = np.asarray([0, 1, 16, 17, 130, 257], np.int32)
    p = make_problem(seed_of("lpl"), lens, 8, 2)
    exact = (lens + p["ps"] - 1) // p["ps"]
    indptr = np.concatenate([[0], np.cumsum(exact)]).astype(np.int32)
    indices = np.concatenate([p["indices"][p["indptr"][r]:p["indptr"][r] + exact[r]] for r in range(len(lens))])
    p = dict(p, indptr=indptr, indices=indices.astype(np.int32))
    last = np.where(exact > 0, lens - (exact - 1) * p["ps"], 0).astype(np.int32)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
    w.plan(p["indptr"], p["indices"], last_page_len=last, num_qo_heads=p["hq"], num_kv_heads=p["hkv"],
           head_dim=p["d"], page_size=p["ps"], num_pages=p["pool"], q_data_type=p["dtype"])
    o_last = w.run(p["q"], p["k"], p["v"])
    plan(w, p)
    o_lens = w.run(p["q"], p["k"], p["v"])
    assert np.array_equal(o_last, o_lens)
    assert_close(o_last, None, ref_of(p), p["dtype"], lens)
    args = dict(num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=16, num_pages=p["pool"])
    with pytest.raises(ValueError, match="exactly one"):
        w.plan(p["indptr"], p["indices"], lens, last_page_len=last, **args)
    with pytest.raises(ValueError, match="exactly one"):
        w.plan(p["indptr"], p["indices"], **args)
    with pytest.raises(TypeError, match="head_dim"):
        w.plan(p["indptr"], p["indices"], lens, 8, 2)
    bad = last.copy()
    bad[1] = 17  # past the page size
    with pytest.raises(ValueError, match="outside 1..page_size"):
        w.plan(p["indptr"], p["indices"], last_page_len=bad, **args)
    bad = last.copy()
    bad[2] = 0  # a row with pages needs at least one token in its last page
    with pytest.raises(ValueError, match="outside 1..page_size"):
        w.plan(p["indptr"], p["indices"], last_page_len=bad, **args)
    bad = last.copy()
    bad[0] = 3  # row 0 has no pages
    with pytest.raises(ValueError, match="no pages"):
        w.plan(p["indptr"], p["indices"], last_page_len=bad, **args)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_run_takes_a_kv_pair_or_one_interleaved_cache(cpu, layout):
    """run(q, (k, v)) and run(q, kv) with K and V interleaved per page ([pages, 2, ...], FlashInfer's
    and vLLM's layout) read the same values as run(q, k, v)."""
    p = make_problem(seed_of("pair", layout), LENS, 8, 2, layout=layout)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", kv_layout=layout)
    plan(w, p, **SPLITTY)
    o = w.run(p["q"], p["k"], p["v"])
    assert_close(o, None, ref_of(p), p["dtype"], p["lens"])
    assert np.array_equal(w.run(p["q"], (p["k"], p["v"])), o)
    kv = np.ascontiguousarray(np.stack([p["k"], p["v"]], axis=1))  # [pages, 2, ...]
    assert np.array_equal(w.run(p["q"], kv), o)
    with pytest.raises(ValueError, match="kv_cache has shape"):
        w.run(p["q"], np.ascontiguousarray(kv[:, :1]))
    with pytest.raises(ValueError, match="must be C-contiguous"):
        w.run(p["q"], np.stack([p["k"], p["v"]], axis=1)[:, :, ::-1])
    # the two halves of the interleaved cache as views (dense pages, a page stride of two pages)
    assert np.array_equal(w.run(p["q"], kv[:, 0], kv[:, 1]), o)
    assert np.array_equal(w.run(p["q"], (kv[:, 0], kv[:, 1])), o)
    # every other page of a pool twice the size: the same pages through a stride
    big_k, big_v = np.repeat(p["k"], 2, axis=0), np.repeat(p["v"], 2, axis=0)
    assert np.array_equal(w.run(p["q"], big_k[::2], big_v[::2]), o)
    with pytest.raises(ValueError, match="share one page stride"):
        w.run(p["q"], big_k[::2], p["v"])
    with pytest.raises(ValueError, match="each page must be dense"):
        w.run(p["q"], np.zeros(p["k"].shape[:3] + (2 * p["d"],), p["k"].dtype)[..., ::2], p["v"])


def fused_qkv_view(q, hkv, fill):
    """q [B, Hq, d] as the query part of a fused QKV projection's output [B, (Hq + 2 Hkv) d] (a view
    with rows (Hq + 2 Hkv) d elements apart), and that whole buffer; the K and V parts hold `fill`."""
    b, hq, d = q.shape
    qkv = np.full((b, (hq + 2 * hkv) * d), fill, dtype=q.dtype)
    qkv[:, : hq * d] = q.reshape(b, hq * d)
    return qkv[:, : hq * d].reshape(b, hq, d), qkv


def test_strided_rows_of_q_and_out(cpu):
    """q read in place from a fused QKV output and out written into the rows of a wider buffer give
    the dense run's outputs bit for bit and leave the rest of each row alone; overlapping rows (and
    a cache whose pages overlap) are refused."""
    p = make_problem(seed_of("rows"), LENS, 8, 2)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
    plan(w, p, **SPLITTY)
    o, lse = w.run(p["q"], p["k"], p["v"], return_lse=True)
    qv, _ = fused_qkv_view(p["q"], 2, np.nan)  # a kernel reading K or V's part as q would give NaN
    assert not qv.flags.c_contiguous
    wide = np.full((len(LENS), 8 * 64 + 40), 7.0, dtype=o.dtype)
    ov = wide[:, : 8 * 64].reshape(o.shape)
    o2, lse2 = w.run(qv, p["k"], p["v"], out=ov, return_lse=True)
    assert o2 is ov and np.array_equal(ov, o) and np.array_equal(lse2, lse)
    assert np.all(wide[:, 8 * 64:] == 7.0)
    with pytest.raises(ValueError, match="overlap"):
        w.run(np.lib.stride_tricks.as_strided(p["q"], strides=(128,) + p["q"].strides[1:]), p["k"], p["v"])
    with pytest.raises(ValueError, match="each row must be dense"):
        w.run(np.zeros(p["q"].shape[:2] + (128,), p["q"].dtype)[..., ::2], p["k"], p["v"])
    with pytest.raises(ValueError, match="overlap"):
        w.run(p["q"], np.broadcast_to(p["k"][:1], p["k"].shape), p["v"])
    odd = np.ndarray(p["q"].shape, p["q"].dtype, buffer=np.zeros(p["q"].nbytes + 64, np.uint8),
                     strides=(p["q"].strides[0] + 1,) + p["q"].strides[1:])  # rows 1024.5 elements apart
    with pytest.raises(ValueError, match="not whole 2-byte elements"):
        w.run(odd, p["k"], p["v"])


def check_definition(p, ro, rl, cap=None, window_left=-1):
    """The float64 reference's (o, lse) against numpy straight from the definition (NHD problems):
    scores s = q.k / sqrt(d), capped to cap * tanh(s / cap), over a row's last window_left + 1 tokens."""
    q, k, v = (to_f64(p[x], p["dtype"]) for x in ("q", "k", "v"))
    G, d = p["hq"] // p["hkv"], p["d"]
    for i, n in enumerate(p["lens"]):
        if n == 0:
            continue
        pages = p["indices"][p["indptr"][i]:p["indptr"][i + 1]]
        first = max(0, n - window_left - 1) if window_left >= 0 else 0
        toks = [(pages[t // p["ps"]], t % p["ps"]) for t in range(first, n)]
        for h in range(p["hq"]):
            kk = np.stack([k[pg, off, h // G] for pg, off in toks])
            vv = np.stack([v[pg, off, h // G] for pg, off in toks])
            s = kk @ q[i, h] / np.sqrt(d)
            if cap:
                s = cap * np.tanh(s / cap)
            e = np.exp(s - s.max())
            np.testing.assert_allclose(ro[i, h], e @ vv / e.sum(), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(rl[i, h], s.max() + np.log(e.sum()), rtol=1e-9)


def run_and_define(p, cap=None, window_left=-1):
    """The CPU wrapper (every route splitting) against the float64 reference, and the reference
    against the definition, with a soft cap or a window; returns the wrapper and the reference o."""
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
    plan(w, p, logits_soft_cap=cap, window_left=window_left, **SPLITTY)
    o, lse = w.run(p["q"], p["k"], p["v"], return_lse=True)
    ro, rl = pkv.reference(p["q"], p["k"], p["v"], p["indptr"], p["indices"], p["lens"], logits_soft_cap=cap,
                           window_left=window_left, q_data_type=p["dtype"])
    assert_close(o, lse, (ro, rl), p["dtype"], p["lens"])
    check_definition(p, ro, rl, cap=cap, window_left=window_left)
    return w, ro


def test_logits_soft_cap(cpu):
    """cap * tanh(s / cap) on the scores: the CPU backend and the float64 reference against numpy."""
    cap = 0.75  # small (so that the cap changes the result on random data) and exact in float32
    p = make_problem(seed_of("cap"), [0, 5, 200, 37], 8, 2)
    w, ro = run_and_define(p, cap=cap)
    plan(w, p, **SPLITTY)
    assert np.linalg.norm(to_f64(w.run(p["q"], p["k"], p["v"]), p["dtype"]) - ro) > 0.05 * np.linalg.norm(ro)
    with pytest.raises(pkv.PkvError):
        plan(w, p, logits_soft_cap=-1.0)
    with pytest.raises(pkv.PkvError):
        plan(w, p, logits_soft_cap=float("nan"))


@pytest.mark.parametrize("window_left", [0, 4, 40, 5000])
def test_sliding_window(cpu, window_left):
    """FlashInfer's window_left: each row attends to its last window_left + 1 tokens; the reference
    against numpy from the definition, the CPU backend against the reference."""
    p = make_problem(seed_of("win", window_left), [0, 1, 60, 700, 17], 8, 2)
    w, _ = run_and_define(p, window_left=window_left)
    with pytest.raises(ValueError):
        plan(w, p, window_left=-2)
    with pytest.raises(ValueError):
        pkv.reference(p["q"], p["k"], p["v"], p["indptr"], p["indices"], p["lens"], window_left=2**32)


def test_empty_batch(cpu):
    p = make_problem(6, [], hq=4, hkv=2)
    plan(cpu, p)
    o, lse = cpu.run(p["q"], p["k"], p["v"], return_lse=True)
    assert o.shape == (0, 4, 64) and lse.shape == (0, 4)


def test_ml_dtypes_bfloat16(cpu):
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed (uint16 bf16 bits are tested)")
    p = make_problem(7, LENS, hq=8, hkv=2, dtype="bfloat16")
    q, k, v = (p[n].view(ml.bfloat16) for n in ("q", "k", "v"))
    plan(cpu, p, q_data_type=ml.bfloat16)
    o = cpu.run(q, k, v)
    assert o.dtype == ml.bfloat16
    assert_close(o.view(np.uint16), None, ref_of(p), "bfloat16", LENS)


# ---- errors -------------------------------------------------------------------------------------
def raises_status(status, fn):
    with pytest.raises(pkv.PkvError) as ei:
        fn()
    e = ei.value
    assert e.status == status and isinstance(e.status, int)
    assert e.status_name == pkv.status_string(status)
    assert e.status_name in str(e)
    return e


def test_plan_errors(cpu):
    p = make_problem(8, [20, 5], hq=8, hkv=2)
    bad = p["indices"].copy()
    bad[1] = p["pool"]
    e = raises_status(pkv.Status.PAGE_OUT_OF_RANGE, lambda: cpu.plan(
        p["indptr"], bad, p["lens"], 8, 2, 64, 16, num_pages=p["pool"]))
    assert e.status_name == "page id out of range" and "kv_page_indices[1]" in e.message
    neg = p["indices"].copy()
    neg[0] = -1
    raises_status(pkv.Status.PAGE_OUT_OF_RANGE, lambda: cpu.plan(p["indptr"], neg, p["lens"], 8, 2, 64, 16))
    raises_status(pkv.Status.HEAD_GROUP, lambda: cpu.plan(p["indptr"], p["indices"], p["lens"], 6, 4, 64, 16))
    raises_status(pkv.Status.UNSUPPORTED_DTYPE, lambda: cpu.plan(
        p["indptr"], p["indices"], p["lens"], 8, 2, 64, 16, q_data_type="float32"))
    raises_status(pkv.Status.UNSUPPORTED_HEAD_DIM, lambda: cpu.plan(p["indptr"], p["indices"], p["lens"], 8, 2, 96, 16))
    raises_status(pkv.Status.PAGE_SIZE, lambda: cpu.plan(p["indptr"], p["indices"], p["lens"], 8, 2, 64, 512))
    raises_status(pkv.Status.LENGTH_EXCEEDS_PAGES, lambda: cpu.plan(
        p["indptr"], p["indices"], [20, 5000], 8, 2, 64, 16))
    raises_status(pkv.Status.NEGATIVE_LENGTH, lambda: cpu.plan(p["indptr"], p["indices"], [20, -1], 8, 2, 64, 16))
    raises_status(pkv.Status.BAD_INDPTR, lambda: cpu.plan([1, 2, 3], p["indices"], p["lens"], 8, 2, 64, 16))
    raises_status(pkv.Status.INVALID_ARGUMENT, lambda: cpu.plan(
        p["indptr"], p["indices"], p["lens"], 8, 2, 64, 16, route="fastest"))
    with pytest.raises(ValueError, match="indptr"):
        cpu.plan(p["indptr"][:-1], p["indices"], p["lens"], 8, 2, 64, 16)
    with pytest.raises(ValueError, match="indices"):
        cpu.plan(p["indptr"], p["indices"][:2], p["lens"], 8, 2, 64, 16)
    with pytest.raises(ValueError, match="unknown data type"):
        cpu.plan(p["indptr"], p["indices"], p["lens"], 8, 2, 64, 16, q_data_type="int8")
    with pytest.raises(TypeError, match="seq_lens"):
        cpu.plan(p["indptr"], p["indices"], np.array([1.0, 2.0]), 8, 2, 64, 16)
    with pytest.raises(RuntimeError, match="plan"):  # the failed plan leaves the wrapper unplanned
        cpu.run(p["q"], p["k"], p["v"])


def test_run_errors(cpu):
    p = make_problem(9, [20, 5], hq=8, hkv=2, layout="NHD")
    plan(cpu, p)
    q, k, v = p["q"], p["k"], p["v"]
    with pytest.raises(TypeError, match="q has dtype float32"):
        cpu.run(q.astype(np.float32), k, v)
    with pytest.raises(TypeError, match="k_cache"):
        cpu.run(q, k.view(np.uint16), v)  # fp16 plan: uint16 bits are not accepted
    with pytest.raises(ValueError, match=r"q has shape \[2, 4, 64\]"):
        cpu.run(q[:, :4].copy(), k, v)
    with pytest.raises(ValueError, match="k_cache has shape .* NHD"):
        cpu.run(q, np.ascontiguousarray(k.transpose(0, 2, 1, 3)), v)  # an HND cache for an NHD plan
    with pytest.raises(ValueError, match="v_cache holds 3 pages"):
        cpu.run(q, k, v[:3])
    with pytest.raises(ValueError, match="q: each row must be dense"):
        cpu.run(np.zeros((8, 2, 64), np.float16).transpose(1, 0, 2), k, v)
    with pytest.raises(ValueError, match="k_cache: each page must be dense"):
        cpu.run(q, np.zeros((k.shape[0], 16, 4, 64), np.float16)[:, :, ::2], v)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        cpu.run(q.tolist(), k, v)
    with pytest.raises(ValueError, match="out has shape"):
        cpu.run(q, k, v, out=np.empty((2, 8, 32), np.float16))
    with pytest.raises(TypeError, match="lse must be float32"):
        cpu.run(q, k, v, lse=np.empty((2, 8), np.float64))
    ro = np.empty_like(q)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cpu.run(q, k, v, out=ro)
    bf = make_problem(10, [20, 5], hq=8, hkv=2, dtype="bfloat16")
    plan(cpu, bf)
    with pytest.raises(TypeError, match="expects bfloat16"):
        cpu.run(q, k, v)  # fp16 data for a bf16 plan


def test_constructor_errors():
    with pytest.raises(ValueError, match="kv_layout"):
        pkv.BatchDecodeWithPagedKVCacheWrapper(kv_layout="NDH")
    with pytest.raises(ValueError, match="backend"):
        pkv.BatchDecodeWithPagedKVCacheWrapper(backend="tpu")
    if not pkv.cuda_available():
        raises_status(pkv.Status.BACKEND_UNAVAILABLE, lambda: pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cuda"))
        assert pkv.BatchDecodeWithPagedKVCacheWrapper(backend="auto").backend == "cpu"


# ---- traces -------------------------------------------------------------------------------------
def test_trace_checksum_bimodal():
    t = pkv.generate_trace("bimodal", 20260623)
    assert t.num_steps == 48 and len(t) == 48
    assert t.checksum == 0xE54CC4D234228FF6
    assert t.config["family"] == "bimodal" and t.num_requests == 24


def test_trace_steps_tables_and_files(tmp_path):
    t = pkv.generate_trace("zipf", 20260624, max_active=4, num_requests=10, page_size=16)
    for s in (0, t.num_steps // 2, t.num_steps - 1):
        ids, lens = t.step(s)
        indptr, indices, lens2 = t.step_table(s)
        assert ids.dtype == np.int32 and len(ids) == len(lens) <= 4
        assert np.array_equal(lens, lens2) and indptr[0] == 0 and indptr[-1] == len(indices)
        assert np.array_equal(np.diff(indptr), (lens + 15) // 16)
        assert indices.min(initial=0) >= 0 and indices.max(initial=0) < t.num_pages
    with pytest.raises(IndexError):
        t.step(t.num_steps)
    path = tmp_path / "zipf.csv"
    t.write(path)
    t2 = pkv.Trace.read(path)
    assert t2.checksum == t.checksum and t2.num_steps == t.num_steps
    raises_status(pkv.Status.IO, lambda: pkv.Trace.read(tmp_path / "missing.csv"))
    with pytest.raises(pkv.PkvError):
        pkv.generate_trace("lognormal", 1)


def test_trace_step_through_wrapper(cpu):
    t = pkv.generate_trace("bucketed", 20260625, page_size=16)
    indptr, indices, lens = t.step_table(t.num_steps - 1)
    # compact the pool to the pages this step uses, keeping the scattered order of the ids
    used, local = np.unique(indices, return_inverse=True)
    rng = np.random.default_rng(0)
    pool = len(used)
    k = rng.standard_normal((pool, 16, 1, 64), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((pool, 16, 1, 64), dtype=np.float32).astype(np.float16)
    q = rng.standard_normal((len(lens), 4, 64), dtype=np.float32).astype(np.float16)
    local = local.astype(np.int32)
    cpu.plan(indptr, local, lens, 4, 1, 64, 16, num_pages=pool, route="auto")
    o = cpu.run(q, k, v)
    assert_close(o, None, pkv.reference(q, k, v, indptr, local, lens), "float16", lens)


def test_block_table_to_csr():
    bt = np.array([[7, 3, 9, -1], [2, -1, -1, -1], [5, 6, 0, 1]], np.int32)
    indptr, indices = pkv.block_table_to_csr(bt, [33, 0, 64], 16)
    assert indptr.tolist() == [0, 3, 3, 7] and indices.tolist() == [7, 3, 9, 5, 6, 0, 1]
    raises_status(pkv.Status.LENGTH_EXCEEDS_PAGES, lambda: pkv.block_table_to_csr(bt, [100, 0, 0], 16))
    with pytest.raises(ValueError):  # not wrapped to page 1
        pkv.block_table_to_csr(np.array([[2**32 + 1]], np.int64), [16], 16)
    with pytest.raises(TypeError):  # not truncated to page 3
        pkv.block_table_to_csr(np.array([[3.7]]), [16], 16)
    with pytest.raises(ValueError):  # not wrapped to 20 tokens
        pkv.block_table_to_csr(bt, [2**32 + 20, 0, 0], 16)
    pad = np.iinfo(np.int64).max  # padding past a row's pages is ignored, whatever its value
    indptr, indices = pkv.block_table_to_csr(np.array([[4, 5, pad], [7, pad, pad]], np.int64), [20, 3], 16)
    assert indptr.tolist() == [0, 2, 3] and indices.tolist() == [4, 5, 7]


def test_arguments_neither_wrap_nor_truncate(cpu):
    """Python ints beyond int32, floats where ints belong and sm_scale <= 0 are refused by name, never
    passed on wrapped (2**32 + 4 heads planned as 4), truncated or replaced by the default scale."""
    p = make_problem(seed_of("args"), [5, 40], 8, 2)
    w = cpu
    for kw in ({"max_splits": 2**32 + 2}, {"num_splits": -2**31 - 1}, {"parallelism": 2**40}):
        with pytest.raises(ValueError, match=list(kw)[0]):
            plan(w, p, **kw)
    with pytest.raises(ValueError, match="num_pages"):
        w.plan(p["indptr"], p["indices"], p["lens"], p["hq"], p["hkv"], p["d"], p["ps"], num_pages=2**64 + 4,
               q_data_type=p["dtype"])
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(p["indptr"], p["indices"], p["lens"], 2**32 + 8, p["hkv"], p["d"], p["ps"], num_pages=p["pool"],
               q_data_type=p["dtype"])
    with pytest.raises(TypeError, match="page_size"):
        w.plan(p["indptr"], p["indices"], p["lens"], p["hq"], p["hkv"], p["d"], 16.0, num_pages=p["pool"],
               q_data_type=p["dtype"])
    for scale in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="sm_scale"):
            plan(w, p, sm_scale=scale)
    with pytest.raises(TypeError, match="logits_soft_cap"):
        plan(w, p, logits_soft_cap="a")
    plan(w, p, sm_scale=0.5)  # and a good plan still goes through
    t = pkv.generate_trace("bimodal", 1)
    with pytest.raises(TypeError, match="step"):
        t.step(1.5)
    with pytest.raises(TypeError, match="request"):
        t.request(2.5)


# ---- torch (CPU tensors; CUDA when available) ---------------------------------------------------
def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: torch tests skipped")
    return torch


def _to_torch(torch, a, dtype, device):
    t = torch.from_numpy(a.view(np.int16) if dtype == "bfloat16" else a)
    t = t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return t.to(device)


def _from_torch(torch, t):
    t = t.detach().cpu()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cpu_tensors(cpu, dtype):
    torch = _torch()
    p = make_problem(13, LENS, hq=8, hkv=2, dtype=dtype, layout="HND")
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", kv_layout="HND")
    q, k, v = (_to_torch(torch, p[n], dtype, "cpu") for n in ("q", "k", "v"))
    w.plan(torch.from_numpy(p["indptr"]), torch.from_numpy(p["indices"]), torch.from_numpy(p["lens"]), 8, 2, 64,
           16, num_pages=p["pool"], q_data_type=getattr(torch, dtype), route="split", **SPLITTY)
    o, lse = w.run(q, k, v, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == q.dtype and lse.dtype == torch.float32
    assert_close(_from_torch(torch, o), lse.numpy(), ref_of(p), dtype, LENS)



def test_graph_stable_plans_cpu():
    """graph_max_batch: steps of 0..6 rows planned on one fixed layout and workspace, each right; a step of
    another shape would not replay a captured graph and is refused."""
    p = make_problem(seed_of("graph-cpu"), [3000, 0, 1, 700, 40, 1500], hq=8, hkv=2)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
    rng = np.random.default_rng(5)
    ws = None
    for k in range(5):
        B = int(rng.integers(0, 7)) if k else 6
        lens = np.array([int(rng.integers(0, n + 1)) for n in p["lens"][:B]], np.int32)
        q = p["q"][:B]
        step = dict(p, lens=lens, indptr=p["indptr"][:B + 1], q=q)
        w.plan(step["indptr"], p["indices"], lens, 8, 2, 64, 16, num_pages=p["pool"], graph_max_batch=6)
        assert w.route == "workqueue"
        info = w.plan_info
        assert info["graph_signature"] != 0 and info["grid_tasks"] >= info["tasks"]
        w.validate_plan()
        ws = ws or w.plan_workspace_size
        assert w.plan_workspace_size == ws
        o, lse = w.run(q, p["k"], p["v"], return_lse=True)
        assert_close(o, lse, ref_of(step), "float16", lens)
    with pytest.raises(ValueError, match="does not launch what the first one did"):
        w.plan(p["indptr"], p["indices"], p["lens"], 8, 2, 64, 16, num_pages=p["pool"] + 1, graph_max_batch=6)
    with pytest.raises(pkv.PkvError):  # above the capacity
        w.plan(p["indptr"], p["indices"], p["lens"], 8, 2, 64, 16, num_pages=p["pool"], graph_max_batch=5)


@pytest.fixture(scope="module")
def cuda_torch():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch: CUDA tests skipped")
    if not pkv.cuda_available():
        pytest.skip("libpersistentkv was built without the CUDA backend (or sees no GPU): CUDA tests skipped")
    return torch


@pytest.mark.parametrize("route", pkv.ROUTES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_matches_reference_and_cpu(cuda_torch, cpu, route, layout, dtype):
    torch = cuda_torch
    p = make_problem(seed_of(route, layout, dtype), LENS, hq=8, hkv=2, layout=layout, dtype=dtype)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cuda", kv_layout=layout)
    assert w.backend == "cuda"
    q, k, v = (_to_torch(torch, p[n], dtype, "cuda") for n in ("q", "k", "v"))
    indices = torch.from_numpy(p["indices"]).cuda()
    # table on the device: plan copies it to the host once and keeps `indices` for run
    w.plan(torch.from_numpy(p["indptr"]).cuda(), indices, torch.from_numpy(p["lens"]).cuda(), 8, 2, 64, 16,
           num_pages=p["pool"], q_data_type=getattr(torch, dtype), route=route, num_splits=3, chunk_pages=2)
    assert w._indices_dev is indices
    o, lse = w.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    assert o.is_cuda and o.dtype == q.dtype and lse.is_cuda
    o_np, lse_np = _from_torch(torch, o), lse.cpu().numpy()
    assert_close(o_np, lse_np, ref_of(p), dtype, LENS)
    c = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", kv_layout=layout)
    plan(c, p, route=route)
    o_cpu = c.run(p["q"], p["k"], p["v"])
    diff = np.linalg.norm(to_f64(o_np, dtype) - to_f64(o_cpu, dtype)) / np.linalg.norm(to_f64(o_cpu, dtype))
    assert diff < TOL[dtype]


@pytest.mark.parametrize("cap,scale,window_left", [(0.75, None, -1), (None, None, 40), (30.0, 8.0, 4)])
def test_cuda_soft_cap_and_window(cuda_torch, cap, scale, window_left):
    """The soft cap and the sliding window on the CUDA backend (every route splitting) against the
    float64 reference with the same options (sm_scale 8 makes a cap of 30 bind on this data)."""
    torch = cuda_torch
    p = make_problem(seed_of("cuda-score", cap, window_left), [0, 1, 60, 700, 17], 8, 2)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cuda")
    q, k, v = (torch.from_numpy(p[n]).cuda() for n in ("q", "k", "v"))
    plan(w, p, logits_soft_cap=cap, sm_scale=scale, window_left=window_left, **SPLITTY)
    o, lse = w.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    ref = pkv.reference(p["q"], p["k"], p["v"], p["indptr"], p["indices"], p["lens"], logits_soft_cap=cap,
                        sm_scale=scale, window_left=window_left, q_data_type=p["dtype"])
    assert_close(o.cpu().numpy(), lse.cpu().numpy(), ref, p["dtype"], p["lens"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_strided_rows_of_q_and_out(cuda_torch, dtype):
    """On the GPU, q read in place from a fused QKV output and out written into a wider buffer: the
    dense run's outputs bit for bit on every route, the rest of out's rows untouched."""
    torch = cuda_torch
    p = make_problem(seed_of("cuda-rows", dtype), LENS, 8, 2, dtype=dtype)
    q, k, v = (_to_torch(torch, p[n], dtype, "cuda") for n in ("q", "k", "v"))
    qkv = torch.full((len(LENS), 12 * 64), float("nan"), dtype=q.dtype, device="cuda")
    qkv[:, : 8 * 64] = q.reshape(len(LENS), -1)
    qv = qkv[:, : 8 * 64].view(len(LENS), 8, 64)
    assert not qv.is_contiguous()
    for route in pkv.ROUTES:
        w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cuda")
        plan(w, p, route=route, **SPLITTY)
        o, lse = w.run(q, k, v, return_lse=True)
        wide = torch.full((len(LENS), 8 * 64 + 16), 7.0, dtype=q.dtype, device="cuda")
        ov = wide[:, : 8 * 64].view(o.shape)
        o2, lse2 = w.run(qv, k, v, out=ov, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(ov, o) and torch.equal(lse2, lse), route
        assert bool((wide[:, 8 * 64:] == 7.0).all()), route
    assert_close(_from_torch(torch, o), lse.cpu().numpy(), ref_of(p), dtype, LENS)


def test_cuda_two_layers_streams_and_errors(cuda_torch):
    torch = cuda_torch
    p = make_problem(21, LENS, hq=16, hkv=4, d=128)
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cuda")
    q, k, v = (torch.from_numpy(p[n]).cuda() for n in ("q", "k", "v"))
    k2, v2 = torch.randn_like(k, dtype=torch.float32).half(), torch.randn_like(v, dtype=torch.float32).half()
    plan(w, p, route="workqueue", **SPLITTY)  # host numpy table: indices copied to the device once
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        o1 = w.run(q, k, v)
        o2 = w.run(q, k2, v2)
    s.synchronize()
    assert_close(o1.cpu().numpy(), None, ref_of(p), "float16", LENS)
    assert_close(o2.cpu().numpy(), None, ref_of(p, k2.cpu().numpy(), v2.cpu().numpy()), "float16", LENS)
    with pytest.raises(TypeError, match="torch CUDA tensor"):
        w.run(p["q"], k, v)
    with pytest.raises(ValueError, match="q is on cpu"):
        w.run(q.cpu(), k, v)
    with pytest.raises(ValueError, match="each row must be dense"):
        w.run(torch.empty(q.shape[:2] + (2 * q.shape[2],), dtype=q.dtype, device=q.device)[..., ::2], k, v)
    with pytest.raises(TypeError, match="dtype"):
        w.run(q.float(), k, v)
    with pytest.raises(ValueError, match="shape"):
        w.run(q[:, :8].contiguous(), k, v)
    bad = p["indices"].copy()
    bad[0] = p["pool"] + 3
    raises_status(pkv.Status.PAGE_OUT_OF_RANGE, lambda: w.plan(
        p["indptr"], torch.from_numpy(bad).cuda(), p["lens"], 16, 4, 128, 16, num_pages=p["pool"]))
    raises_status(pkv.Status.HEAD_GROUP, lambda: w.plan(p["indptr"], p["indices"], p["lens"], 10, 4, 128, 16))
    assert w.parallelism > 0 and w.device_name


def test_policy_file_drives_auto(tmp_path):
    """A policy file (as `pkv calibrate` writes it) makes route="auto" follow its cost model."""
    assert ctypes.sizeof(_lib.CostModel) == 216  # sizeof(pkv_cost_model) in C
    # launches cost everything: auto must pick a one-launch route (single or fused)
    path = tmp_path / "launch_bound.policy"
    path.write_text("persistentkv-policy 2\ndevice = synthetic\nparallelism = 32\n"
                    "const_us = 0\nlaunch_us = 100\nfused_merge_us_per_mb = 0\nmerge_us_per_mb = 0\nus_per_mb = 0\n"
                    "idle_us_per_mb = 0\nrho_mb_per_token = 0.05\nsoftmax_p = 3\n")
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", num_threads=2, policy=path)
    p = make_problem(seed_of("policy"), LENS, hq=8, hkv=2)
    plan(w, p, route="auto", **SPLITTY)
    assert w.route in ("single", "fused")
    o, lse = w.run(p["q"], p["k"], p["v"], return_lse=True)
    assert_close(o, lse, ref_of(p), "float16", LENS)
    bad = tmp_path / "bad.policy"
    bad.write_text("persistentkv-policy 2\nconst_us = -1\n")
    with pytest.raises(pkv.PkvError) as e:
        pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", policy=bad)
    assert e.value.status == 17  # PKV_ERR_PARSE
