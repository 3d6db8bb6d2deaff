-- Delete the claim on KEYS[1], if the caller holds it.
--
-- ARGV[1]  the caller's claim prefix (in-flight tag, token length, token)
-- ARGV[2]  the store's wake channel: a deleted claim is published on it,
--          with KEYS[1] as the message, when a repeat waits for it (a
--          waiter marked the claim, see mark.lua)
--
-- Returns 1 when the claim was deleted, and when the key holds nothing (a
-- resent release whose first reply was lost, or a claim that lapsed: the key
-- is free, as asked); 0 when another owner's claim or a record holds it.
-- GETRANGE answers "" for a missing key, and the store never writes an
-- empty value.
local p = ARGV[1]
-- The owner and, for a claim, its 48 fixed bytes (fingerprint,
-- created-at, expires-at) and the byte of a waiter's mark (mark.lua).
local v = redis.call('GETRANGE', KEYS[1], 0, #p + 48)
if string.sub(v, 1, #p) == p then
  local marked = #v > #p + 48
  redis.call('DEL', KEYS[1])
  if marked then
    redis.pcall('PUBLISH', ARGV[2], KEYS[1])
  end
  return 1
end
if v == '' then
  return 1
end
return 0
