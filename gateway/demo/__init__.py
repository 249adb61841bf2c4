"""The built-in scripted model and example tools: the whole loop with no provider and no key."""
