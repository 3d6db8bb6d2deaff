-- Claim KEYS[1] for a request, or report what holds it. One round trip.
--
-- ARGV[1]  the claim's value: owner (tag, token length, token), fingerprint,
--          created-at (see encoding.go)
-- ARGV[2]  how many leading bytes of ARGV[1] name the owner
-- ARGV[3]  the claim's life in milliseconds
--
-- Returns 1 when the key was free and is now claimed, 2 when it is already
-- claimed by this owner (a resent claim whose first reply was lost),
-- {remaining life in ms, value} when another owner holds it in flight, and
-- the kept record otherwise. Never nil: a nil reply costs the client far more
-- than an integer.
--
-- A kept record is told by its kind alone, before any string is cut: a
-- replay, the common answer, costs a GET and one byte's test. (An owner
-- prefix starts with an in-flight tag, so it never matches a record.)
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return 1
end
if string.byte(v, 1) % 16 ~= 1 then
  return v
end
local n = tonumber(ARGV[2])
if string.sub(v, 1, n) == string.sub(ARGV[1], 1, n) then
  return 2
end
return {redis.call('PTTL', KEYS[1]), v}
