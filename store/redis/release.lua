-- Delete the claim on KEYS[1], if the caller holds it.
--
-- ARGV[1]  the owner prefix (tag, token length, token)
--
-- Returns 1 when the claim was deleted, 0 when the caller does not hold it.
local p = ARGV[1]
if redis.call('GETRANGE', KEYS[1], 0, #p - 1) ~= p then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
