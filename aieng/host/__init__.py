"""Facts about the machine a process runs on: its CPU (``hardware``), the cores and memory a
container may use (``container_limits``), its GPUs (``gpus``), and the end-to-end GPU host check
(``gpu_check``). Nothing here touches CUDA on a host without it."""
