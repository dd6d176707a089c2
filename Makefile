# Two commands from a fresh clone: `make run` and `make test`. Both create .venv first.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: run test test-latest pins lint docs golden screenshots bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# [hf]: transformers and tokenizers, for `--hf` and its tests (built offline, tiny).
	# [notebook]: ipywidgets, ipykernel, nbclient, nbformat, for the notebook display and the
	# test that runs examples/walkthrough.ipynb with a real kernel. [serve]: textual-serve,
	# for `mha-tui serve` and its browser test (Chromium: .ci/run installs it). [docs]: MkDocs,
	# Material and mkdocstrings, for the manual in docs/ (`make docs`).
	# pyproject accepts a torch range; constraints.txt pins this project's own CPU build
	# (see docs/install.md), which pip takes from the local wheel here.
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,hf,notebook,serve,docs]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mha-tui explain --heads 2 "I love AI !"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The manual (docs/, mkdocs.yml) built in strict mode: a broken link, a missing page or an API
# reference that no longer resolves fails. Offline: no web fonts, no plugin that fetches.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

test: lint docs
	_TYPER_FORCE_DISABLE_TERMINAL=1 $(BIN)/python -m pytest

# The family and --hf tests against the newest transformers and tokenizers, in a venv of its
# own (.venv-latest): everything else as pinned. Run it to see a release's change the day it
# lands; the pinned set-up (make test) stays reproducible.
LATEST := .venv-latest
HF_TESTS := tests/test_families.py tests/test_hf.py tests/test_hf_files.py tests/test_hf_input.py tests/test_why_hf.py
test-latest:
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	grep -v -i -E '^(transformers|tokenizers|huggingface.hub)==' constraints.txt > $(LATEST)/constraints.txt
	$(LATEST)/bin/python -m pip install --quiet -c $(LATEST)/constraints.txt -e ".[dev,hf]"
	$(LATEST)/bin/python -m pip install --quiet -c $(LATEST)/constraints.txt --upgrade transformers tokenizers
	@$(LATEST)/bin/python -m pip freeze | grep -i -E '^(transformers|tokenizers)=='
	_TYPER_FORCE_DISABLE_TERMINAL=1 $(LATEST)/bin/python -m pytest -q $(HF_TESTS)

# Pin every package of the set-up again after a deliberate upgrade (read the diff).
pins: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v -i -E '^(torch|textual|typer)==' > .pins.tmp
	sed -n '1,/^# Everything else/p' constraints.txt > constraints.new
	sort -f .pins.tmp >> constraints.new && rm .pins.tmp && mv constraints.new constraints.txt

# Regenerate the pinned transcript after a deliberate change; read the diff before committing.
golden: $(STAMP)
	$(BIN)/mha-tui explain --heads 2 "I love AI !" --dump tests/golden/default.txt
	$(BIN)/mha-tui explain --heads 2 "I love AI !" --ascii --dump tests/golden/default-ascii.txt
	$(BIN)/mha-tui explain "I love AI !" --dump tests/golden/why-softmax.txt --why "softmax[0, 1, 2, 1]"
	$(BIN)/mha-tui explain "I love AI !" --dump tests/golden/why-scores.txt --why "scores[0, 1, 2, 1]"
	$(BIN)/mha-tui explain "I love AI !" --model many-eyes --dump tests/golden/why-project-many-eyes.txt --why "project[0, 1, 3]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/llama_rotary.py:LlamaAttention --dump tests/golden/why-rotary.txt --why "rotary[0, 1, 2, 3]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/llama_rotary.py:LlamaAttention --dump tests/golden/why-kv_repeat.txt --why "kv_repeat[0, 3, 2, 1]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/alibi.py:BloomAttention --dump tests/golden/why-pos_bias.txt --why "pos_bias[0, 3, 2, 1]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/post_norm.py:BertAttention --dump tests/golden/why-residual.txt --why "residual[0, 1, 2]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/timm_fused.py:Attention --init dim=16 --dump tests/golden/why-qkv_split.txt --why "qkv_split[0, 1, 2, 3]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/prenorm.py:PreNormAttention --dump tests/golden/why-norm.txt --why "norm[0, 1, 2]"
	$(BIN)/mha-tui explain "I love AI !" --module tests/fixtures/nanogpt_attn.py:CausalSelfAttention --dump tests/golden/why-sdpa-softmax.txt --why "softmax[0, 1, 2, 1]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/gqa_sdpa.py:GQAAttention --dump tests/golden/why-sdpa-attend-gqa.txt --why "attend[0, 3, 5, 2]"
	$(BIN)/mha-tui explain "I love AI !" --module tests/fixtures/sdpa_variants.py:FloatMask --dump tests/golden/why-sdpa-mask-float.txt --why "mask[0, 1, 3, 0]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/softcap.py:Gemma2Attention --dump tests/golden/why-op-softcap.txt --why "op-2[0, 1, 2, 1]"
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/fnet_fourier.py:FNetBasicFourierTransform --dump tests/golden/why-op-fnet.txt --why "op[0, 2, 3]"
	$(BIN)/mha-tui explain "I love AI !" --heads 2 --module tests/fixtures/einsum_attn.py:EinsumAttention --dump tests/golden/why-einsum-attend.txt --why "attend[0, 1, 2, 1]"
	$(BIN)/mha-tui explain "I love AI !" --quiz --dump tests/golden/quiz-default.txt
	$(BIN)/mha-tui explain "I love AI !" --quiz --dump tests/golden/quiz-default.md
	$(BIN)/mha-tui explain "the cat sat on the mat" -C 16 -H 4 --module tests/fixtures/mechanisms/llama_rotary.py:LlamaAttention --quiz --dump tests/golden/quiz-llama.txt
	$(BIN)/mha-tui explain "I love AI !" --module tests/fixtures/mistakes/no_scale.py:MultiHeadAttention --against mygpt --dump tests/golden/against-no-scale.txt
	$(BIN)/mha-tui explain "I love AI !" --against many-eyes --ascii --dump tests/golden/against-many-eyes-ascii.txt
	$(BIN)/mha-tui explain "I love AI !" --module tests/fixtures/mistakes/softmax_axis.py:MultiHeadAttention --against mygpt --width 80 --dump tests/golden/against-softmax-axis-80.txt

screenshots: $(STAMP)
	$(BIN)/python -m mha_tui.screenshots screenshots

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[bench]"
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache .ruff_cache .hypothesis site
