"""aieng's own forward for the Llama family: the step runner (``runner``), the layer math
(``llama``), the static KV slots (``slots``), weight formats chosen by measurement (``formats``,
``format_plan_cache``, ``packed_weights``, ``onednn_caches``), what the compiled stack needs
(``compile_marks``), the CPU kernels (``kernels``: decode attention, few-row matrix products)
and a hot swap's successor (``succession``). ``serving_path`` decides which models come here."""
