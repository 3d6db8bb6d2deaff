-- Replace the claim on KEYS[1] with a kept record, if the caller holds it.
--
-- ARGV[1]  the owner prefix (tag, token length, token)
-- ARGV[2]  the record
-- ARGV[3]  retention in milliseconds
--
-- Returns 1 when the record was kept, 0 when the caller does not hold the
-- claim (nothing is written).
local p = ARGV[1]
if redis.call('GETRANGE', KEYS[1], 0, #p - 1) ~= p then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
