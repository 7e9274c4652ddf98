"""The render layer: chat templates to tokens with exact per-message spans (``rendering``,
``incremental``), tool text for templates without tool syntax (``tool_text``), template
probes (``template_data``), the project's offline tokenizer (``tiny_tokenizer``)."""
