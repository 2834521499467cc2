-- wrk script: POST a small chat completion; count statuses and receipts per thread.
-- The totals are printed as one JSON line at the end (prefixed "WRK_JSON ") for the bench.
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"echo","messages":[{"role":"user","content":"Say hello to the reef in five words."}],"max_tokens":16}'

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  ok, other, receipts = 0, 0, 0
end

function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
    if headers["x-reef-agent-record-id"] ~= nil then
      receipts = receipts + 1
    end
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local t_ok, t_other, t_receipts = 0, 0, 0
  for _, thread in ipairs(threads) do
    t_ok = t_ok + thread:get("ok")
    t_other = t_other + thread:get("other")
    t_receipts = t_receipts + thread:get("receipts")
  end
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"ok":%d,"non_2xx":%d,"receipts":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeouts":%d,' ..
    '"p50_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,"mean_us":%.1f,"max_us":%.1f}\n',
    summary.requests, summary.duration, t_ok, t_other, t_receipts,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
