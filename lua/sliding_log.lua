-- fleetgate sliding-window log.
--
-- One atomic script keeps, per target, a sorted set of admission times (the
-- log), a fleet-wide pause and a heartbeat set of live processes. Every key
-- arrives through KEYS and shares one {hash tag}, so a target lives in one
-- Redis Cluster slot. Times are integer microseconds of the Redis server's
-- clock (TIME), so every worker shares one timeline whatever its own clock.
--
-- KEYS[1] log    sorted set: member = one admitted unit, score = its slot (us)
-- KEYS[2] pause  string: the end of the fleet-wide pause (us)
-- KEYS[3] procs  sorted set: member = process id, score = last seen (us)
--
-- ARGV[1] op: "reserve" | "cancel" | "pause" | "restore"
-- ARGV[2] now: "" to read the server clock (production); tests may pass us.
--
-- reserve: ARGV[3] limit, [4] window us, [5] gap us, [6] process id,
--          [7] liveness us (negative: only mark this process live, do
--          not trim the heartbeat set), [8] the latest slot (us) this
--          process has seen in the log, 0 if none, [9] count k, then k
--          triples: member prefix, units n, max wait us (-1: no bound).
--   If the log is empty although that slot is still inside the window,
--   Redis has lost the log (a restart, a failover): the target is paused
--   until a window after that slot, as if the lost log had been full.
--   Each request in turn gets the earliest slot s >= now such that every
--   interval of length window holds at most limit units once its n units are
--   written at s: s is after the pause, after every earlier entry (FIFO), at
--   least gap after the latest entry, and at least window after the
--   (limit-n+1)-th most recent entry. A request whose slot is further away
--   than its max wait is refused and writes nothing.
--   Reply: {now, remaining, reset us, live, tail us, pause us,
--           then per request: granted (1/0), delay us}.
-- cancel:  ARGV[3..] members to remove. Reply: {now, removed, the last
--          entry's slot or 0 when the log is now empty}.
-- pause:   ARGV[3] duration us (0 reads the pause). The pause only grows.
--          Reply: {now, pause us remaining}.
-- restore: ARGV[3] window us, then pairs: member, age us (the entry's slot is
--          now - age, negative ages are future slots). Reply: {now, added}.

local log, pausekey, procs = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]

local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function pexpire_until(key, until_us)
  -- A TTL in whole milliseconds, never 0: the key outlives its last use.
  local ms = math.floor((until_us - now) / 1000) + 1
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, ms)
end

local function pause_until()
  local p = tonumber(redis.call('GET', pausekey))
  if p and p > now then return p end
  return 0
end

local function last_score()
  local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #last == 2 then return tonumber(last[2]) end
  return nil
end

if op == 'reserve' then
  local limit = tonumber(ARGV[3])
  local window = tonumber(ARGV[4])
  local gap = tonumber(ARGV[5])
  local proc = ARGV[6]
  local liveness = tonumber(ARGV[7])
  local seen = tonumber(ARGV[8])
  local k = tonumber(ARGV[9])
  if not (limit and window and gap and liveness and seen and k) or limit < 1 or window < 1 then
    return redis.error_reply('fleetgate: bad reserve arguments')
  end

  redis.call('ZREMRANGEBYSCORE', log, '-inf', now - window)
  local pause = pause_until()
  -- card and last follow every write below, so each is read once.
  local card = redis.call('ZCARD', log)
  local last = nil
  if card > 0 then
    last = last_score()
  elseif seen > now - window and seen + window > pause then
    pause = seen + window -- the log was lost: count it as full
    redis.call('SET', pausekey, pause)
    pexpire_until(pausekey, pause)
  end
  local out = {}
  local wrote = false
  for i = 0, k - 1 do
    local prefix = ARGV[10 + 3 * i]
    local n = tonumber(ARGV[11 + 3 * i])
    local maxwait = tonumber(ARGV[12 + 3 * i])
    local slot = now
    if pause > slot then slot = pause end
    if last then
      if last > slot then slot = last end
      if gap > 0 and last + gap > slot then slot = last + gap end
    end
    local granted = 0
    if n and n >= 1 and n <= limit then
      local idx = card - (limit - n) -- 1-based rank of the (limit-n+1)-th most recent
      if idx >= 1 then
        local e = redis.call('ZRANGE', log, idx - 1, idx - 1, 'WITHSCORES')
        local bound = tonumber(e[2]) + window
        if bound > slot then slot = bound end
      end
      if maxwait < 0 or slot - now <= maxwait then
        granted = 1
        if n == 1 then
          card = card + redis.call('ZADD', log, slot, prefix)
        else
          -- ZADD in chunks: unpack has a stack limit.
          local args = {}
          for j = 1, n do
            args[#args + 1] = slot
            args[#args + 1] = prefix .. '.' .. j
            if #args >= 1000 or j == n then
              card = card + redis.call('ZADD', log, unpack(args))
              args = {}
            end
          end
        end
        last, wrote = slot, true
      end
    else
      slot = now + window -- an impossible request: never granted
    end
    out[#out + 1] = granted
    out[#out + 1] = slot - now
  end
  if wrote then pexpire_until(log, last + window) end

  -- The heartbeat: every call marks its process live and counts the live
  -- processes. Trimming the dead and renewing the TTL is done about once a
  -- second per process and target (a negative liveness skips it; until
  -- then a stopped process may be counted a little longer, never less).
  local added = redis.call('ZADD', procs, now, proc)
  if liveness > 0 then
    redis.call('ZREMRANGEBYSCORE', procs, '-inf', now - liveness)
    pexpire_until(procs, now + liveness)
  elseif added == 1 then -- a new set (after a restart) needs its TTL now
    pexpire_until(procs, now - liveness)
  end
  local live = redis.call('ZCARD', procs)

  local remaining = limit - card
  if remaining < 0 or pause > 0 then remaining = 0 end
  local reset, tail = 0, 0
  if last then
    reset = last + window - now
    if last > now then tail = last - now end
  end
  local paused = 0
  if pause > 0 then paused = pause - now end
  local reply = {now, remaining, reset, live, tail, paused}
  for i = 1, #out do reply[#reply + 1] = out[i] end
  return reply

elseif op == 'cancel' then
  local removed = 0
  for i = 3, #ARGV do
    removed = removed + redis.call('ZREM', log, ARGV[i])
  end
  return {now, removed, last_score() or 0}

elseif op == 'pause' then
  local d = tonumber(ARGV[3])
  if not d or d < 0 then return redis.error_reply('fleetgate: bad pause duration') end
  local cur = pause_until()
  if d > 0 and now + d > cur then
    cur = now + d
    redis.call('SET', pausekey, cur)
    pexpire_until(pausekey, cur)
  end
  local left = 0
  if cur > now then left = cur - now end
  return {now, left}

elseif op == 'restore' then
  local window = tonumber(ARGV[3])
  if not window or window < 1 then return redis.error_reply('fleetgate: bad restore window') end
  local added = 0
  for i = 4, #ARGV - 1, 2 do
    local age = tonumber(ARGV[i + 1])
    if age then
      local slot = now - age
      if slot > now - window then
        added = added + redis.call('ZADD', log, slot, ARGV[i])
      end
    end
  end
  local last = last_score()
  if last then pexpire_until(log, last + window) end
  return {now, added}
end

return redis.error_reply('fleetgate: unknown op ' .. tostring(op))
