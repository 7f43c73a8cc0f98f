-- wrk script for every HTTP scenario: unique label names per request, JSON bodies.
-- Arguments after "--": MODE MACHINE PREFIX N NTHREADS [KEY]
--   create: POST  /state-machines/MACHINE/labels/PREFIX-<thread>-<k>   (new name each time)
--   read:   GET   /state-machines/MACHINE/labels/PREFIX-<random 0..N-1>
--   patch:  PATCH /state-machines/MACHINE/labels/PREFIX-<i>  {"metadata": {KEY: true}}
--           each of PREFIX-0 .. PREFIX-(N-1) exactly once; a thread stops when its share is done
-- With ROUTEMASTER_BENCH_TOKEN set, every request carries "Authorization: Bearer <it>".
-- done() prints one line "BENCHJSON {...}" that the harness parses.

local next_thread = 0

function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
end

function init(args)
  mode, machine, prefix = args[1], args[2], args[3]
  n = tonumber(args[4])
  nthreads = tonumber(args[5])
  key = args[6] or "go"
  -- wrk calls request() once on thread 0 to check the script (script_verify_request):
  -- start that thread one step early so the check does not eat PREFIX-0
  k = (tid == 0) and -1 or 0
  base = "/state-machines/" .. machine .. "/labels/"
  wrk.headers["Content-Type"] = "application/json"
  local token = os.getenv("ROUTEMASTER_BENCH_TOKEN")
  if token and token ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. token
  end
  math.randomseed(os.time() * 1000 + tid)
  patch_body = '{"metadata": {"' .. key .. '": true}}'
end

function request()
  if mode == "create" then
    k = k + 1
    return wrk.format("POST", base .. prefix .. "-" .. tid .. "-" .. k, nil,
                      '{"metadata": {"n": ' .. k .. ', "go": false}}')
  elseif mode == "read" then
    return wrk.format("GET", base .. prefix .. "-" .. math.random(0, n - 1))
  else
    local i = tid + nthreads * k
    k = k + 1
    if i < 0 then
      return wrk.format("GET", "/")
    end
    if i >= n then
      wrk.thread:stop()
      return wrk.format("GET", "/")
    end
    return wrk.format("PATCH", base .. prefix .. "-" .. i, nil, patch_body)
  end
end

function done(summary, latency, requests)
  io.write(string.format(
    'BENCHJSON {"requests": %d, "duration_us": %d, "status_errors": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
