-- Deletes KEYS[1] only while it still holds ARGV[1]: what an operator was
-- shown (Inspect) and agreed to delete. Returns 1 when it deleted the key,
-- 0 when the key holds something else or nothing.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
