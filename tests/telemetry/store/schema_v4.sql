CREATE TABLE IF NOT EXISTS trajectories (
    id TEXT PRIMARY KEY, started REAL NOT NULL, ended REAL NOT NULL);
CREATE INDEX IF NOT EXISTS trajectories_ended ON trajectories (ended);
CREATE TABLE IF NOT EXISTS requests (
    span_id TEXT NOT NULL, trace_id TEXT NOT NULL, trajectory_id TEXT NOT NULL, name TEXT, route TEXT,
    status INTEGER, rounds INTEGER, limit_reached INTEGER, error_type TEXT, started REAL NOT NULL,
    duration_ms REAL NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS requests_key ON requests (trajectory_id, span_id);
CREATE TABLE IF NOT EXISTS model_turns (
    span_id TEXT NOT NULL, trace_id TEXT NOT NULL, trajectory_id TEXT NOT NULL, request_span_id TEXT,
    round INTEGER NOT NULL, model TEXT, response_model TEXT, provider TEXT, response_id TEXT, finish_reasons TEXT,
    stream INTEGER, input_tokens INTEGER, output_tokens INTEGER, error_type TEXT, error_message TEXT,
    input_messages TEXT, output_messages TEXT, started REAL NOT NULL, duration_ms REAL NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS model_turns_key ON model_turns (trajectory_id, span_id);
CREATE INDEX IF NOT EXISTS model_turns_of_request ON model_turns (trajectory_id, request_span_id);
CREATE TABLE IF NOT EXISTS tool_calls (
    span_id TEXT NOT NULL, trace_id TEXT NOT NULL, request_span_id TEXT, trajectory_id TEXT NOT NULL, round INTEGER,
    tool TEXT NOT NULL, call_id TEXT, outcome TEXT, rejection_reason TEXT, error_type TEXT, missing TEXT,
    unrecognized TEXT, suggestions TEXT, retry_kind TEXT, retries_trace_id TEXT, retries_span_id TEXT,
    diagnostic TEXT, arguments TEXT, mcp_server TEXT, mcp_method TEXT, started REAL NOT NULL,
    duration_ms REAL NOT NULL, side TEXT, client_ms REAL, result_bytes INTEGER, result_outcome TEXT,
    decision TEXT, decided_by TEXT, approval_wait_ms REAL);
CREATE UNIQUE INDEX IF NOT EXISTS tool_calls_key ON tool_calls (trajectory_id, span_id);
CREATE INDEX IF NOT EXISTS tool_calls_of_request ON tool_calls (trajectory_id, request_span_id);
