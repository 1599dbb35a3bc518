"""Interop with other EAGLE-3 trainers: a run's task stores -> the files speculators or SpecForge train on
(`export-data`), and a speculators folder -> a task store (`import-data`).

- `layers.py`: the layer-id conventions (eagle-batch's and vLLM's: a layer's input; SpecForge's: a layer's
  output, one less) and which stored layers each peer gets;
- `hf_arrow.py`: an HF `datasets` folder (what `Dataset.save_to_disk` writes), streamed with pyarrow;
- `manifest.py`: the export's resumable record (its parameters, the samples done);
- `speculators.py`, `specforge.py`: one peer's per-sample file and its closing files each;
- `export.py`: the driver (store -> peer files, resumable); `importer.py`: speculators -> task store.
The formats, as each peer's own reader takes them: docs/reference/store-format.md, "Exported for other trainers".
"""
