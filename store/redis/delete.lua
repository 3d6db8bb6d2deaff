-- Deletes KEYS[1] only while it still holds ARGV[1]: what an operator was
-- shown (Inspect) and agreed to delete. Returns 1 when it deleted the key,
-- 0 when the key holds something else or nothing.
--
-- ARGV[2]  the store's wake channel: a deleted key is published on it,
--          with KEYS[1] as the message, so that the repeats waiting on a
--          deleted claim claim again at once
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- pcall: a user that may not publish still deletes.
  redis.pcall('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
return 0
