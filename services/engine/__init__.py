"""The built-in CPU inference engine, serving SGLang's native HTTP API for any Hugging Face causal LM."""
