-- Replace the claim on KEYS[1] with a kept record, if the caller holds it.
--
-- ARGV[1]  the caller's claim prefix (in-flight tag, token length, token)
-- ARGV[2]  the record, which opens with the caller's record prefix (record
--          tag, token length, token): as long as the claim prefix
-- ARGV[3]  retention in milliseconds
-- ARGV[4]  the store's wake channel: a kept record is published on it,
--          with KEYS[1] as the message, when a repeat waits for it (a
--          waiter marked the claim, see mark.lua)
--
-- Returns 1 when the record was kept, and when the key already holds the
-- caller's record (a resent complete whose first reply was lost: nothing is
-- written); 0 when the caller holds neither (nothing is written); 2 when
-- Redis refused to store the record (out of memory under maxmemory): the
-- claim is then held for the retention instead, so that no retry runs the
-- request again while the record could not be kept.
local p = ARGV[1]
-- The owner and, for a claim, its 48 fixed bytes (fingerprint,
-- created-at, expires-at) and the byte of a waiter's mark (mark.lua).
local v = redis.call('GETRANGE', KEYS[1], 0, #p + 48)
if string.sub(v, 1, #p) == p then
  local marked = #v > #p + 48
  local r = redis.pcall('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if type(r) == 'table' and r.err then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return 2
  end
  -- pcall: a user that may not publish still keeps the record (its
  -- waiters then claim again at their recheck).
  if marked then
    redis.pcall('PUBLISH', ARGV[4], KEYS[1])
  end
  return 1
end
if string.sub(v, 1, #p) == string.sub(ARGV[2], 1, #p) then
  return 1
end
return 0
