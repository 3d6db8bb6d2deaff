-- Replace the claim on KEYS[1] with a kept record, if the caller holds it.
--
-- ARGV[1]  the caller's claim prefix (in-flight tag, token length, token)
-- ARGV[2]  the record, which opens with the caller's record prefix (record
--          tag, token length, token): as long as the claim prefix
-- ARGV[3]  retention in milliseconds
--
-- Returns 1 when the record was kept, and when the key already holds the
-- caller's record (a resent complete whose first reply was lost: nothing is
-- written); 0 when the caller holds neither (nothing is written).
local p = ARGV[1]
local v = redis.call('GETRANGE', KEYS[1], 0, #p - 1)
if v == p then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v == string.sub(ARGV[2], 1, #p) then
  return 1
end
return 0
