"""Where the trial workers keep their persistent compilation cache."""
import os

from paxsearch.search.workers.pool import compilation_cache_dir


def test_run_folder_cache_unless_jax_compilation_cache_dir_is_set(tmp_path):
    own = os.path.join(tmp_path, "xla_cache")
    assert compilation_cache_dir(str(tmp_path), {}) == own
    assert compilation_cache_dir(str(tmp_path), {"JAX_COMPILATION_CACHE_DIR": ""}) == own
    shared = str(tmp_path / "shared")
    assert compilation_cache_dir(str(tmp_path), {"JAX_COMPILATION_CACHE_DIR": shared}) == shared
