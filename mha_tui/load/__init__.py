"""The load room: building the module and its input, before anything is traced.

- `modules.py`: torch modules -- `--model NAME` (the tutorials in mha_tui/examples),
  `--module FILE.py:Class`, `--init`, `--weights` (torch.load(weights_only=True) or
  safetensors), and x with its embedding;
- `numpy_modules.py`: NumPy modules -- the blueprint and a learner's NumPy class, x (T, C)
  and the additive causal mask; never imports torch;
- `learner.py`: a learner's file imported and run safely (the torch-free half shared by both).

This package imports nothing itself, so `load.learner` and `load.numpy_modules` never bring
torch in. Never import rich, textual, typer or the recogniser here.
"""
