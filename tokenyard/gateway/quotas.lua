-- Quota scripts: each runs atomically inside Redis, so any number of gateways agree.
-- Time comes from Redis (TIME), never from a gateway's clock. A limit of 0 means unlimited.
-- Leases (concurrency, KV pages) live in a sorted set scored by expiry; a dead gateway's leases
-- are purged by the next reservation of the same team once they expire.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- give one lease's KV pages back to the team's total
local function free_pages(pages, id)
  local p = tonumber(redis.call('HGET', pages, id))
  if p then
    -- 0 pages (not a paged model): Lua's -0 reaches Redis as "-0", which HINCRBY refuses
    if p ~= 0 then redis.call('HINCRBY', pages, '#sum', -p) end
    redis.call('HDEL', pages, id)
  end
end

-- drop expired leases, returning their KV pages to the team's total
local function purge(leases, pages, now)
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #expired == 0 then return end
  if pages then
    for _, id in ipairs(expired) do free_pages(pages, id) end
  end
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
end

-- release one lease (settle): returns nothing; idempotent
local function release(leases, pages, id)
  redis.call('ZREM', leases, id)
  if pages then free_pages(pages, id) end
end

-- a token bucket's level at `now`: it holds up to `limit` and refills limit/minute continuously
local function level_at(key, limit, now)
  local state = redis.call('HMGET', key, 'level', 'ts')
  local level = tonumber(state[1]) or limit
  local ts = tonumber(state[2]) or now
  return math.min(limit, level + (now - ts) * limit / 60000)
end

-- take `amount` from a bucket whose level was read at `now` (nil: the bucket has no limit)
local function take(key, level, amount, now)
  if not level then return -1 end
  redis.call('HSET', key, 'level', level - amount, 'ts', now)
  redis.call('PEXPIRE', key, 120000)
  return level - amount
end

-- give `amount` back to a bucket, never past full; refunds do not depend on a lease: a lease
-- that expired early still took its tokens
local function give_back(key, limit, amount)
  if limit > 0 and amount ~= 0 then
    local level = tonumber(redis.call('HGET', key, 'level'))
    if level then redis.call('HSET', key, 'level', math.min(limit, level + amount)) end
  end
end

local op = ARGV[1]

if op == 'reserve' then
  -- KEYS: rpm bucket, tpm bucket, day tokens (the batch tier's own counter for batch), day usd
  --       (micro-dollars), team leases, team pages, platform leases, platform batch leases,
  --       the key's own rpm bucket, tpm bucket, day usd and leases, the end user's own rpm bucket,
  --       tpm bucket and day usd, the team's and the key's month usd, the team's rpm and tpm
  --       buckets of the model the request was routed to, the platform's (every team's), and the
  --       key's own
  -- ARGV: op, lease id, rpm, tpm, tokens/day (of that counter), usd/day (micro), concurrency, kv pages,
  --       platform concurrency, platform batch concurrency, tokens, pages, lease ms, batch (0/1),
  --       the key's rpm, tpm, usd/day (micro) and concurrency, the end user's rpm, tpm and usd/day
  --       (micro; all 0 for a request that names no end user), the team's and the key's usd/month
  --       (micro), the month's end (unix seconds), the team's rpm and tpm on that model, the
  --       platform's rpm and tpm on it, the key's rpm and tpm on it
  local id = ARGV[2]
  local rpm, tpm, tpd, upd = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local conc, kvp = tonumber(ARGV[7]), tonumber(ARGV[8])
  local pconc, pbatch = tonumber(ARGV[9]), tonumber(ARGV[10])
  local tokens, pages, lease_ms, batch = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), ARGV[14] == '1'
  local krpm, ktpm, kupd, kconc = tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])
  local urpm, utpm, uupd = tonumber(ARGV[19]), tonumber(ARGV[20]), tonumber(ARGV[21])
  local upm, kupm, month_end = tonumber(ARGV[22]), tonumber(ARGV[23]), tonumber(ARGV[24])
  local mrpm, mtpm = tonumber(ARGV[25]), tonumber(ARGV[26])
  local prpm, ptpm = tonumber(ARGV[27]), tonumber(ARGV[28])
  local kmrpm, kmtpm = tonumber(ARGV[29]), tonumber(ARGV[30])
  local now = now_ms()
  local to_midnight = 86400 - math.floor(now / 1000) % 86400
  local to_month_end = math.max(1, month_end - math.floor(now / 1000))
  local worst, wait = nil, -1

  local function refuse(code, seconds)
    if seconds > wait then worst, wait = code, seconds end
  end

  local function bucket(key, limit, amount, code)
    if limit <= 0 then return nil end
    local level = level_at(key, limit, now)
    if amount > limit then
      refuse(code, 60)  -- can never fit; the message says so
    elseif level < amount then
      refuse(code, math.ceil((amount - level) * 60 / limit))
    end
    return level
  end

  local rpm_level = bucket(KEYS[1], rpm, 1, 'requests_per_minute')
  local tpm_level = bucket(KEYS[2], tpm, tokens, 'tokens_per_minute')
  if tpd > 0 and (tonumber(redis.call('GET', KEYS[3])) or 0) + tokens > tpd then
    refuse('tokens_per_day', to_midnight)
  end
  if upd > 0 and (tonumber(redis.call('GET', KEYS[4])) or 0) >= upd then
    refuse('usd_per_day', to_midnight)
  end
  local krpm_level = bucket(KEYS[9], krpm, 1, 'key_requests_per_minute')
  local ktpm_level = bucket(KEYS[10], ktpm, tokens, 'key_tokens_per_minute')
  if kupd > 0 and (tonumber(redis.call('GET', KEYS[11])) or 0) >= kupd then
    refuse('key_usd_per_day', to_midnight)
  end
  local urpm_level = bucket(KEYS[13], urpm, 1, 'user_requests_per_minute')
  local utpm_level = bucket(KEYS[14], utpm, tokens, 'user_tokens_per_minute')
  if uupd > 0 and (tonumber(redis.call('GET', KEYS[15])) or 0) >= uupd then
    refuse('user_usd_per_day', to_midnight)
  end
  local mrpm_level = bucket(KEYS[18], mrpm, 1, 'model_requests_per_minute')
  local mtpm_level = bucket(KEYS[19], mtpm, tokens, 'model_tokens_per_minute')
  local prpm_level = bucket(KEYS[20], prpm, 1, 'platform_model_requests_per_minute')
  local ptpm_level = bucket(KEYS[21], ptpm, tokens, 'platform_model_tokens_per_minute')
  local kmrpm_level = bucket(KEYS[22], kmrpm, 1, 'key_model_requests_per_minute')
  local kmtpm_level = bucket(KEYS[23], kmtpm, tokens, 'key_model_tokens_per_minute')
  if upm > 0 and (tonumber(redis.call('GET', KEYS[16])) or 0) >= upm then
    refuse('usd_per_month', to_month_end)
  end
  if kupm > 0 and (tonumber(redis.call('GET', KEYS[17])) or 0) >= kupm then
    refuse('key_usd_per_month', to_month_end)
  end
  purge(KEYS[5], KEYS[6], now)
  if conc > 0 and redis.call('ZCARD', KEYS[5]) >= conc then refuse('concurrency', 1) end
  purge(KEYS[12], nil, now)
  if kconc > 0 and redis.call('ZCARD', KEYS[12]) >= kconc then refuse('key_concurrency', 1) end
  if kvp > 0 and (tonumber(redis.call('HGET', KEYS[6], '#sum')) or 0) + pages > kvp then
    refuse('kv_pages', pages > kvp and 60 or 1)
  end
  purge(KEYS[7], nil, now)
  purge(KEYS[8], nil, now)
  if pconc > 0 and redis.call('ZCARD', KEYS[7]) >= pconc then refuse('platform_concurrency', 1) end
  if batch and pbatch > 0 and redis.call('ZCARD', KEYS[8]) >= pbatch then
    refuse('platform_batch_concurrency', 1)
  end
  -- the per-minute buckets' levels go back with the verdict: the x-ratelimit-* headers
  if worst then
    return {0, worst, math.max(1, wait), rpm_level or -1, tpm_level or -1, krpm_level or -1,
            ktpm_level or -1, urpm_level or -1, utpm_level or -1, mrpm_level or -1,
            mtpm_level or -1, kmrpm_level or -1, kmtpm_level or -1}
  end

  -- everything fits: take it all
  local left = {take(KEYS[1], rpm_level, 1, now), take(KEYS[2], tpm_level, tokens, now),
                take(KEYS[9], krpm_level, 1, now), take(KEYS[10], ktpm_level, tokens, now),
                take(KEYS[13], urpm_level, 1, now), take(KEYS[14], utpm_level, tokens, now),
                take(KEYS[18], mrpm_level, 1, now), take(KEYS[19], mtpm_level, tokens, now),
                take(KEYS[22], kmrpm_level, 1, now), take(KEYS[23], kmtpm_level, tokens, now)}
  take(KEYS[20], prpm_level, 1, now)  -- the platform's: not the team's to see in its headers
  take(KEYS[21], ptpm_level, tokens, now)
  redis.call('INCRBY', KEYS[3], tokens)
  redis.call('EXPIRE', KEYS[3], 172800)
  redis.call('ZADD', KEYS[5], now + lease_ms, id)
  if kconc > 0 then redis.call('ZADD', KEYS[12], now + lease_ms, id) end
  redis.call('HSET', KEYS[6], id, pages)
  redis.call('HINCRBY', KEYS[6], '#sum', pages)
  redis.call('ZADD', KEYS[7], now + lease_ms, id)
  if batch then redis.call('ZADD', KEYS[8], now + lease_ms, id) end
  return {1, unpack(left)}

elseif op == 'settle' then
  -- KEYS: tpm bucket, day tokens, team leases, team pages, platform leases, platform batch leases,
  --       usage stream, day usd (micro-dollars), the key's own tpm bucket, day usd and leases, the end
  --       user's own tpm bucket and day usd, the team's and the key's month usd, the team's tpm
  --       bucket of the model reserved on, the platform's and the key's
  -- ARGV: op, lease id, tokens reserved, tokens used, tpm limit, event (JSON), spend (micro-dollars;
  --       0 for teams without a dollar budget), the key's tpm limit, the key's spend (0: no budget),
  --       the end user's tpm limit and spend (0: none), the team's and the key's spend for the
  --       month (0: no monthly budget), the alert percents ("80,100"), the team's usd/day and
  --       usd/month and the key's usd/day and usd/month (micro; 0: none), the day ("2026-11-27")
  --       and the month ("2026-11") the reservation charges, the team's tpm limit on the model,
  --       the platform's, the key's
  local id = ARGV[2]
  local delta = tonumber(ARGV[4]) - tonumber(ARGV[3])  -- < 0: refund the unused reservation
  give_back(KEYS[1], tonumber(ARGV[5]), -delta)
  give_back(KEYS[9], tonumber(ARGV[8]), -delta)
  give_back(KEYS[12], tonumber(ARGV[10]), -delta)
  give_back(KEYS[16], tonumber(ARGV[21]), -delta)
  give_back(KEYS[17], tonumber(ARGV[22]), -delta)
  give_back(KEYS[18], tonumber(ARGV[23]), -delta)
  if delta ~= 0 and redis.call('EXISTS', KEYS[2]) == 1 then redis.call('INCRBY', KEYS[2], delta) end
  release(KEYS[3], KEYS[4], id)
  release(KEYS[5], nil, id)
  release(KEYS[6], nil, id)
  release(KEYS[11], nil, id)
  -- a day's counters outlive their day by one, a month's by a few days (32 + 3)
  local function charge(key, spend, ttl)
    if spend > 0 then
      local total = redis.call('INCRBY', key, spend)
      redis.call('EXPIRE', key, ttl)
      return total
    end
  end
  -- budget alerts: the percents of a budget this charge crossed. A period's spend only grows, so
  -- exactly one settle crosses each, whichever gateway runs it
  local alerts = {}
  local function watch(budget, period, spend, total, limit)
    if not total or limit <= 0 then return end
    for percent in string.gmatch(ARGV[14], '%d+') do
      local at = limit * tonumber(percent) / 100
      if total - spend < at and total >= at then
        alerts[#alerts + 1] = {budget = budget, period = period, percent = tonumber(percent),
                               spent = total, limit = limit}
      end
    end
  end
  local spend, key_spend = tonumber(ARGV[7]), tonumber(ARGV[9])
  local month_spend, key_month_spend = tonumber(ARGV[12]), tonumber(ARGV[13])
  watch('usd_per_day', ARGV[19], spend, charge(KEYS[8], spend, 172800), tonumber(ARGV[15]))
  watch('key_usd_per_day', ARGV[19], key_spend, charge(KEYS[10], key_spend, 172800),
        tonumber(ARGV[17]))
  charge(KEYS[13], tonumber(ARGV[11]), 172800)
  watch('usd_per_month', ARGV[20], month_spend, charge(KEYS[14], month_spend, 3024000),
        tonumber(ARGV[16]))
  watch('key_usd_per_month', ARGV[20], key_month_spend,
        charge(KEYS[15], key_month_spend, 3024000), tonumber(ARGV[18]))
  -- no MAXLEN: billing trims the stream below what every consumer group has acknowledged; the
  -- alerts ride with the event, so billing records both or neither
  if #alerts > 0 then
    redis.call('XADD', KEYS[7], '*', 'event', ARGV[6], 'alerts', cjson.encode(alerts))
  else
    redis.call('XADD', KEYS[7], '*', 'event', ARGV[6])
  end
  return 1

elseif op == 'move' then
  -- a request handed to another model after its upstream failed before the first byte: the
  -- team's and every team's buckets on the new model must hold it as a reservation would; the
  -- model it leaves gets its tokens back (its request was made there, so that count stays)
  -- KEYS: the team's, the platform's and the key's rpm and tpm buckets on the new model (in that
  --       order), then their tpm buckets on the model left
  -- ARGV: op, tokens reserved, the six limits of the new model's buckets, the three of the
  --       model left's, in the order of KEYS
  local tokens, now = tonumber(ARGV[2]), now_ms()
  local codes = {'model_requests_per_minute', 'model_tokens_per_minute',
                 'platform_model_requests_per_minute', 'platform_model_tokens_per_minute',
                 'key_model_requests_per_minute', 'key_model_tokens_per_minute'}
  local levels = {}
  for i = 1, 6 do
    local limit, amount = tonumber(ARGV[i + 2]), i % 2 == 1 and 1 or tokens
    if limit > 0 then
      levels[i] = level_at(KEYS[i], limit, now)
      if levels[i] < amount then return {0, codes[i]} end
    end
  end
  for i = 1, 6 do take(KEYS[i], levels[i], i % 2 == 1 and 1 or tokens, now) end
  for i = 7, 9 do give_back(KEYS[i], tonumber(ARGV[i + 2]), tokens) end
  return {1}

elseif op == 'renew' then
  -- KEYS: lease sets; ARGV: op, lease ms, then the lease id held in each KEYS[i]
  local until_ms = now_ms() + tonumber(ARGV[2])
  for i, key in ipairs(KEYS) do
    redis.call('ZADD', key, 'XX', until_ms, ARGV[i + 2])
  end
  return #KEYS
end
return redis.error_reply('unknown op ' .. tostring(op))
