"""Transformers' own forward, for every served model the native forward does not implement: the
step runner (``runner``), its left-padded batch cache (``kv_batch``) and the compiled whole-model
forward (``compiled``)."""
