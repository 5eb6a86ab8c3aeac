"""The forkserver preload of a party's process pools (services/crypto/psi.py ``forkserver``: the PSI's, and a tree
node's products, services/crypto/product_pool.py, whose workers import the CKKS code themselves, once each): the
curve code, once, for every worker forked from it, and workers that do not re-import the parent's main module.

multiprocessing prepares each worker like a spawned process: it re-imports the parent's ``__main__`` (for a party,
``vflsec`` and its CLI's imports, numpy among them: ~30 MB resident per worker, counted again in each). A PSI worker
runs only :mod:`~vflsec.services.crypto.curve`'s functions on bytes, so this module, imported only in that
forkserver (it is nobody's import), turns that step off for the workers forked from it."""

from multiprocessing import spawn

from vflsec.services.crypto import curve  # noqa: F401 (loaded once here, shared by every worker forked from here)

spawn._fixup_main_from_name = lambda mod_name: None  # type: ignore[attr-defined]
spawn._fixup_main_from_path = lambda main_path: None  # type: ignore[attr-defined]
