"""Write design space: how requests map to threads (blocks x threads, one request per thread; thin:
a small plan a warp of requests per block), how many chain entries a thread keeps in flight
(unroll), and how two sources' folds run (pairs: 0 one after another, 1 in lockstep in one lane, 2
split over two lanes where ``kernels.common.splits_sources`` allows)."""

CUDA_KNOBS = {"blocks": [132, 264, 528], "threads": [32, 64, 128, 256], "unroll": [1, 2, 4, 8, 16], "thin": [0, 1],
              "pairs": [0, 1, 2]}
CPU_KNOBS = {"unroll": [1, 2, 4, 8]}
