"""The rule of gateway.state.fair in Redis: Lua run inside Redis, so that counting, choosing and
dropping are one step however many replicas write at once.

A bounded table keeps, beside its entries, a sorted set of each owner's entries (the owner's set:
`<sets><owner>`, an owner being a digest of a gateway key's name, or "-" without keys) and a sorted
set of the owners by how many entries each holds (the counts). Every script that adds to or takes
from an owner's set counts that owner again, so the counts follow the sets. The scripts name the
sets of other owners than the caller's themselves (from the counts), as a single Redis allows.

What the scripts meet that is not what the gateway wrote (a set of another Redis type, an owner or
a member of a set that names nothing the gateway makes) is dropped, never followed: a member is
deleted as an entry only when it names one of the table's. Each is reported back, a pair of the
key it was found in and a word for what it was ("type": a set of another Redis type, "member":
a member that names no entry, "owner": an owner that names no gateway key), for the caller to
count and log (redis_values.UnreadableValues).
"""

from __future__ import annotations

import hashlib

KEYLESS = "-"  # the owner of what is written without gateway keys


def owner_name(principal: str | None) -> str:
    """The owner a principal's entries are kept under: a digest of its name, or KEYLESS."""
    if principal is None:
        return KEYLESS
    return hashlib.sha256(principal.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# What every script starts with. `unreadable` collects the reports the script returns.
LIBRARY = """
local unreadable = {}

local function report(key, word)
  unreadable[#unreadable + 1] = key
  unreadable[#unreadable + 1] = word
end

-- A sorted set to use: one of another Redis type is deleted (and reported), and starts anew.
local function usable(key)
  local kind = redis.call('type', key)['ok']
  if kind == 'zset' or kind == 'none' then return true end
  redis.call('del', key)
  report(key, 'type')
  return false
end

local function is_owner(owner)
  return owner == '-' or (#owner == 16 and string.match(owner, '^[0-9a-f]+$') ~= nil)
end

-- How many entries the owner's set holds, written into the counts (an owner holding none leaves).
local function recount(counts, sets, owner)
  local set = sets .. owner
  usable(set)
  local held = redis.call('zcard', set)
  if held > 0 then redis.call('zadd', counts, held, owner) else redis.call('zrem', counts, owner) end
  return held
end

-- The owner whose oldest entry goes: of those holding the most, the one whose oldest entry has the
-- lowest score. A count found wrong (a set changed or expired behind the counts) is corrected, and
-- the choice made again; nil when no owner holds anything.
local function fair_owner(counts, sets)
  for _ = 1, 8 do
    local top = redis.call('zrevrange', counts, 0, 0, 'withscores')
    if #top == 0 then return nil end
    local most, chosen, oldest, wrong = tonumber(top[2]), nil, nil, false
    for _, owner in ipairs(redis.call('zrangebyscore', counts, most, most)) do
      if not is_owner(owner) then
        redis.call('zrem', counts, owner)
        report(counts, 'owner')
        wrong = true
      elseif recount(counts, sets, owner) ~= most then
        wrong = true
      else
        local first = redis.call('zrange', sets .. owner, 0, 0, 'withscores')
        if oldest == nil or tonumber(first[2]) < oldest then chosen, oldest = owner, tonumber(first[2]) end
      end
    end
    if not wrong then return chosen end
  end
  return nil
end
"""

# The entries of a table of RedisState: each a key `<head><owner>:<digest>`, a string with the
# table's TTL; in the table's set of all entries (by last use, KEYS[1]) and in its owner's set.
ENTRIES = LIBRARY + """
local everyone, counts, sets, head = KEYS[1], KEYS[2], ARGV[1], ARGV[2]

-- The owner of a member that names an entry of this table; nil for anything else.
local function entry_owner(member)
  if string.sub(member, 1, #head) ~= head then return nil end
  local owner, digest = string.match(string.sub(member, #head + 1), '^([^:]+):([0-9a-f]+)$')
  if owner == nil or #digest ~= 40 or not is_owner(owner) then return nil end
  return owner
end

-- Drop the owner's oldest entry (the entry's key with it, when the member names one of this table's).
local function drop_oldest(owner)
  local popped = redis.call('zpopmin', sets .. owner)
  if #popped > 0 then
    local member = popped[1]
    redis.call('zrem', everyone, member)
    if entry_owner(member) == owner then redis.call('del', member)
    else report(sets .. owner, 'member') end
  end
  recount(counts, sets, owner)
end

-- The owner of what the set of all entries names first, once anything there that is no entry of
-- an owner's set is dropped from it (garbage, which a count of all entries must not count); nil
-- when the set is empty.
local function first_owner()
  while true do
    local first = redis.call('zrange', everyone, 0, 0)
    if #first == 0 then return nil end
    local owner = entry_owner(first[1])
    if owner ~= nil and usable(sets .. owner) and redis.call('zscore', sets .. owner, first[1]) then
      return owner
    end
    redis.call('zrem', everyone, first[1])
    if owner == nil then report(everyone, 'member') end
  end
end

-- Entries past their time (their keys expired already) leave the sets.
local function forget_expired(cutoff)
  local touched = {}
  for _, member in ipairs(redis.call('zrangebyscore', everyone, '-inf', cutoff)) do
    local owner = entry_owner(member)
    if owner ~= nil then
      redis.call('zrem', sets .. owner, member)
      touched[owner] = true
    else
      report(everyone, 'member')
    end
  end
  redis.call('zremrangebyscore', everyone, '-inf', cutoff)
  for owner in pairs(touched) do recount(counts, sets, owner) end
end
"""

# Write the caller's entries (KEYS[3..], values ARGV[7..]), then keep the bounds: the caller's
# share first (its own oldest go), then the capacity (the oldest of the owner holding the most).
# ARGV: sets, head, now, TTL in ms, capacity, the caller's share (0: none), the caller (owner).
PUT = ENTRIES + """
local now, ttl_ms, capacity, share, owner = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
usable(everyone)
usable(counts)
usable(sets .. owner)
forget_expired(now - tonumber(ttl_ms) / 1000)
for i = 3, #KEYS do
  redis.call('set', KEYS[i], ARGV[i + 5], 'PX', ttl_ms)
  redis.call('zadd', everyone, now, KEYS[i])
  redis.call('zadd', sets .. owner, now, KEYS[i])
end
local held = recount(counts, sets, owner)
while share > 0 and held > share do
  drop_oldest(owner)
  held = held - 1
end
while redis.call('zcard', everyone) > capacity do
  local first = first_owner()
  if first == nil then break end
  if redis.call('zcard', everyone) > capacity then drop_oldest(fair_owner(counts, sets) or first) end
end
return unreadable
"""

# Read and forget the caller's entries (KEYS[3..]) at once: their values (0 for a key of another
# Redis type, which stays), then the reports. ARGV: sets, head, the caller (owner).
TAKE = ENTRIES + """
local owner, values = ARGV[3], {}
usable(everyone)
usable(counts)
for i = 3, #KEYS do
  local value = redis.pcall('getdel', KEYS[i])
  if type(value) == 'table' and value['err'] then value = 0 end
  values[#values + 1] = value
  redis.call('zrem', everyone, KEYS[i])
  if usable(sets .. owner) then redis.call('zrem', sets .. owner, KEYS[i]) end
end
recount(counts, sets, owner)
return {values, unreadable}
"""
