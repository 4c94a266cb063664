"""The inference engine seam: a tiny local model, a managed vLLM server, chat-level TITO, weight updates."""
