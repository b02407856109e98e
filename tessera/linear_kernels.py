"""The names of what may run the language model's linear layers (the decoder's
`--linear-kernel`), apart from the code that runs them, so that flags parse without torch."""

AUTO = "auto"  # timed on the host at load, shape by shape (tessera.linear_choice)
ONEDNN = "onednn"  # oneDNN with each weight packed once (tessera.onednn_linear)
TORCH = "torch"  # torch's own matmul
LINEAR_KERNELS = (AUTO, ONEDNN, TORCH)
