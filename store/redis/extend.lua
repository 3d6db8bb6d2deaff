-- Set the remaining life of the claim on KEYS[1], if the caller holds it.
--
-- ARGV[1]  the caller's claim prefix (in-flight tag, token length, token)
-- ARGV[2]  the new life in milliseconds
-- ARGV[3]  the new expires-at of the claim's value (8 bytes, see
--          encoding.go), written 40 bytes after the prefix
--
-- Returns 1 when the life was set, 0 when the caller does not hold the claim.
local p = ARGV[1]
if redis.call('GETRANGE', KEYS[1], 0, #p - 1) ~= p then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
-- The expires-at inside the value only feeds Retry-After hints. Writing it
-- needs memory, which a Redis at maxmemory refuses: the life is set either
-- way, so that a running handler's claim never lapses for want of memory.
redis.pcall('SETRANGE', KEYS[1], #p + 40, ARGV[3])
return 1
