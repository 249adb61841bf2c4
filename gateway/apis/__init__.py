"""One adapter per wire API, peers behind the same engine: Chat Completions (chat), the Responses
API (responses) and Anthropic's Messages (messages). gateway.apis.base says what an adapter is;
gateway.apis.registry holds them."""
