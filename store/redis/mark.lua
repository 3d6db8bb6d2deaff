-- Read KEYS[1] for a repeat that waits on it, and mark a claim in flight
-- there as waited for, so that the complete and release scripts publish
-- its end on the wake channel (they publish nothing for a claim nobody
-- waits on: in a Cluster every PUBLISH goes to every node).
--
-- The mark is one byte after a version 2 claim's 48 fixed bytes (see
-- encoding.go), written with SETRANGE, which keeps the key's life. A
-- claim marked already, a version 1 claim (whose writers' scripts always
-- publish) and a record are left as they are. pcall: a server out of
-- memory refuses the byte, and the waiter then claims again at its
-- recheck.
--
-- Returns the value the key held before the mark (false: nothing).
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, 1) == 0x21 and #v == 2 + string.byte(v, 2) + 48 then
  redis.pcall('SETRANGE', KEYS[1], #v, 'w')
end
return v
