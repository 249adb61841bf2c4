"""toolspan: an OpenAI-compatible gateway that runs the model's tool calls and traces each one."""
