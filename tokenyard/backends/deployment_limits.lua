-- One deployment's requests and tokens in the current minute (docs/backends.md). KEYS[1]: its
-- counts hash; ARGV: requests per minute (0: none), tokens per minute (0: none), the request's
-- tokens, the key's lifetime in seconds. The minute is the Redis server's, so gateways on skewed
-- clocks count into one window. A request over a limit is refused and counts nothing; one larger
-- than the whole tpm still goes when the minute is fresh (it could never go otherwise).
-- Returns {1, 0} if taken, else {0, seconds until the next minute}.
local t = redis.call('TIME')
local minute = math.floor(tonumber(t[1]) / 60)
local key = KEYS[1] .. ':' .. minute
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local c = redis.call('HMGET', key, 'r', 't')
local requests, used = tonumber(c[1] or '0'), tonumber(c[2] or '0')
if (rpm > 0 and requests + 1 > rpm) or (tpm > 0 and used > 0 and used + tokens > tpm) then
  return {0, 60 - (tonumber(t[1]) % 60)}
end
redis.call('HINCRBY', key, 'r', 1)
redis.call('HINCRBY', key, 't', tokens)
redis.call('EXPIRE', key, tonumber(ARGV[4]))
return {1, 0}
