-- One backend's circuit breaker (docs/backends.md). KEYS[1]: its state hash; KEYS[2]: the
-- half-open probe lock; KEYS[3]: the teams whose requests the backend recently answered with a 500. Time is the Redis server's, so gateways on skewed clocks agree; the reply
-- carries the milliseconds left open rather than a timestamp for the same reason.
-- ARGV: ok count, failure count, "1" if a probe reports, consecutive-failure threshold,
-- error-rate threshold, window ms, minimum requests in the window, open ms, and the team a failure
-- may be the fault of ('' when it is the backend's: unreachable, timed out, overloaded); ok and
-- failure counts of 0 (a read) change nothing.
-- Returns {state, ms left open (<= 0: half-open)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oks, fails, probe = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1'
local threshold, rate = tonumber(ARGV[4]), tonumber(ARGV[5])
local window, min_requests, open_ms = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local blamed = ARGV[9] or ''
local s = redis.call('HMGET', KEYS[1], 'state', 'until', 'streak', 'win_start', 'win_total',
  'win_fails')
local state = s[1] or 'closed'
local open_until = tonumber(s[2] or '0')
if oks + fails == 0 then
  return {state, open_until - now}
end
local streak, ws = tonumber(s[3] or '0'), tonumber(s[4] or '0')
local wt, wf = tonumber(s[5] or '0'), tonumber(s[6] or '0')
if state == 'open' then
  -- only the probe's outcome counts: others are requests begun before the breaker opened
  if not (probe and now >= open_until) then
    return {state, open_until - now}
  end
  redis.call('DEL', KEYS[2])
  if fails == 0 then
    state, streak, ws, wt, wf = 'closed', 0, now, 0, 0
  else
    open_until = now + open_ms
  end
else
  if fails > 0 and blamed ~= '' then
    -- a 500 may be what one team's requests provoke: it counts against the backend every team
    -- shares only once the requests of at least two teams fail so within the window
    redis.call('SADD', KEYS[3], blamed)
    redis.call('PEXPIRE', KEYS[3], window)
    if redis.call('SCARD', KEYS[3]) < 2 then
      fails = 0
    end
  end
  if now - ws >= window then
    ws, wt, wf = now, 0, 0
  end
  wt, wf = wt + oks + fails, wf + fails
  if oks > 0 then
    streak = 0  -- successes flushed with a failure count as earlier than it
  end
  streak = streak + fails
  if streak >= threshold or (wt >= min_requests and wf >= rate * wt) then
    state, open_until = 'open', now + open_ms
  end
end
redis.call('HSET', KEYS[1], 'state', state, 'until', open_until, 'streak', streak,
  'win_start', ws, 'win_total', wt, 'win_fails', wf)
return {state, open_until - now}
