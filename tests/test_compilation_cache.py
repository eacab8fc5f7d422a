"""Tests of jaxdp.enable_compilation_cache (opt-in persistent JAX compilation cache)."""

import subprocess
import sys
import textwrap

import pytest

import jaxdp


def test_rejects_negative_min_compile_time(tmp_path):
  with pytest.raises(ValueError, match="min_compile_time_secs"):
    jaxdp.enable_compilation_cache(tmp_path, min_compile_time_secs=-1.0)


def test_second_process_loads_the_compiled_solver_from_disk(tmp_path):
  """A fresh process with the cache on writes entries; a second one finds them (same keys)."""
  script = textwrap.dedent(f"""
      import numpy as np, jax, jaxdp
      d = jaxdp.enable_compilation_cache({str(tmp_path)!r})
      assert jax.config.jax_compilation_cache_dir == d
      assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
      from jaxdp.training import linear
      rng = np.random.default_rng(0)
      x = rng.normal(size=(40, 3)); x /= np.linalg.norm(x, axis=1, keepdims=True)
      m = linear.fit_linear(x, (x[:, 0] > 0) * 1, loss="logistic", l2_reg=0.1)
      print(float(m.weights[0]))
  """)
  run = lambda: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1]
  first = run()
  entries = sorted(p.name for p in tmp_path.iterdir())
  assert any(name.startswith("jit__fit") for name in entries)
  second = run()
  assert second == first  # same program, same result
  assert sorted(p.name for p in tmp_path.iterdir()) == entries  # nothing recompiled
