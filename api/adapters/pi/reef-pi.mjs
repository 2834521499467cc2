// reef-pi: keeps the pi coding agent's harness (rules, skills, prompt templates) and its Reef
// provider in step with a Reef scenario, and sends feedback on pi's last session.
//   reef-pi update                          install the scenario's newest harness release
//   reef-pi report --score S [--feedback T] report on the last pi session's receipts
//   reef-pi evolve "<ask>" [--no-wait]      ask Reef for a harness change (POST /reef/train),
//                                           and follow the job until its candidate waits for review
//   reef-pi status                          what is installed
// Written by Reef's installer; the token, when Reef needs one, comes from REEF_API_KEY.
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.dirname(fileURLToPath(import.meta.url));
const cfg = JSON.parse(fs.readFileSync(path.join(ROOT, "config.json"), "utf8"));
const AGENT = process.env.PI_CODING_AGENT_DIR || path.join(os.homedir(), ".pi", "agent");
const STATE = path.join(ROOT, "installed.json");
const LAST_SESSION = path.join(ROOT, "last-session");
// where each part of a harness goes in pi's agent directory (harness.json stays with Reef)
const PLACES = [
  ["AGENTS.md", "AGENTS.md"],
  ["skills/", "skills/"],
  ["prompts/", "prompts/"],
  ["extensions/", "extensions/"],
];

const sha256 = (data) => createHash("sha256").update(data).digest("hex");
const say = (msg) => console.log(`reef-pi: ${msg}`);
const readJson = (file, fallback) => {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8"));
  } catch {
    return fallback;
  }
};

function writeAtomic(file, data) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.reef-pi-${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

async function api(method, route, body) {
  const headers = { "content-type": "application/json", "x-reef-scenario": cfg.scenario };
  if (process.env.REEF_API_KEY) headers.authorization = `Bearer ${process.env.REEF_API_KEY}`;
  const res = await fetch(`${cfg.url}${route}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let data;
  try {
    data = JSON.parse(text);
  } catch {
    data = { error: { message: text.slice(0, 500) } };
  }
  if (!res.ok) throw new Error(`${method} ${route}: ${res.status} ${data?.error?.message ?? text}`);
  return data;
}

function placeOf(harnessPath) {
  for (const [prefix, dest] of PLACES) {
    if (harnessPath === prefix || (prefix.endsWith("/") && harnessPath.startsWith(prefix))) {
      return path.join(AGENT, dest + harnessPath.slice(prefix.length));
    }
  }
  return null;
}

function provider() {
  return {
    baseUrl: `${cfg.url}/v1`,
    api: "openai-completions",
    apiKey: "REEF_API_KEY", // pi reads the named environment variable
    headers: { "x-reef-scenario": cfg.scenario, "x-reef-session-id": "REEF_PI_SESSION" },
    compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
    models: [{ id: cfg.model, contextWindow: cfg.context_window, maxTokens: cfg.max_tokens }],
  };
}

function intact(state) {
  const files = state.files ?? {};
  for (const [file, digest] of Object.entries(files)) {
    if (!fs.existsSync(file) || sha256(fs.readFileSync(file)) !== digest) return false;
  }
  const models = readJson(path.join(AGENT, "models.json"), {});
  return JSON.stringify(models?.providers?.reef) === JSON.stringify(provider());
}

async function update() {
  const h = await api("GET", `/reef/harness?scenario=${encodeURIComponent(cfg.scenario)}`);
  const state = readJson(STATE, {});
  if (state.release_id === h.release_id && intact(state)) {
    say(`release ${h.release_id} is installed already; nothing new`);
    return;
  }
  const files = {};
  for (const f of h.files) {
    if (sha256(f.content) !== f.sha256) throw new Error(`${f.path}: content does not match its sha256`);
    const target = placeOf(f.path);
    if (target === null) continue;
    writeAtomic(target, f.content);
    files[target] = f.sha256;
  }
  for (const old of Object.keys(state.files ?? {})) {
    if (!(old in files)) fs.rmSync(old, { force: true });
  }
  const modelsFile = path.join(AGENT, "models.json");
  const models = readJson(modelsFile, {});
  models.providers = { ...(models.providers ?? {}), reef: provider() };
  writeAtomic(modelsFile, `${JSON.stringify(models, null, 2)}\n`);
  for (const [file, digest] of Object.entries(files)) {
    if (sha256(fs.readFileSync(file)) !== digest) throw new Error(`verifying ${file} failed`);
  }
  writeAtomic(
    STATE,
    `${JSON.stringify(
      { release_id: h.release_id, content_hash: h.content_hash, files, installed_at: new Date().toISOString() },
      null,
      2,
    )}\n`,
  );
  say(`installed release ${h.release_id} (${Object.keys(files).length} files, ${h.content_hash ?? "no harness"})`);
}

function flag(args, name) {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}

async function report(args) {
  const score = flag(args, "--score");
  const feedback = flag(args, "--feedback");
  if (score === undefined && feedback === undefined) throw new Error("report needs --score S and/or --feedback T");
  if (!fs.existsSync(LAST_SESSION)) throw new Error("no pi session yet: run pi through reef-pi's wrapper first");
  const session = fs.readFileSync(LAST_SESSION, "utf8").trim();
  const s = await api("GET", `/reef/scenarios/${encodeURIComponent(cfg.scenario)}/sessions/${encodeURIComponent(session)}`);
  const references = s.data.map((r) => r.id);
  if (references.length === 0) throw new Error(`session ${session} has no records`);
  const body = { references };
  if (score !== undefined) body.score = Number(score);
  if (feedback !== undefined) body.feedback = feedback;
  const r = await api("POST", "/reef/report", body);
  say(`reported on ${references.length} receipts of session ${session}: ${r.id ?? r.report_id ?? "ok"}`);
}

async function evolve(args) {
  const wait = !args.includes("--no-wait");
  const text = args.filter((a) => a !== "--no-wait").join(" ").trim();
  if (!text) throw new Error('evolve needs an ask: reef-pi evolve "when I ask you to fix a bug, ..."');
  let job = await api("POST", "/reef/train", { text });
  say(`job ${job.id}: ${job.status} (poll ${job.url})`);
  let shown = job.steps.length;
  while (wait && (job.status === "queued" || job.status === "running")) {
    await new Promise((done) => setTimeout(done, 1000));
    job = await api("GET", `/reef/train/${job.id}?scenario=${encodeURIComponent(cfg.scenario)}`);
    for (const step of job.steps.slice(shown)) say(`  ${step.step}`);
    shown = job.steps.length;
  }
  if (job.status === "failed") throw new Error(`job ${job.id} failed: ${job.message}`);
  if (job.status === "done") {
    const changed = job.result.diff ?? {};
    say(`candidate ${job.candidate_id} waits for review: ${JSON.stringify(changed)}`);
    say(`evaluation: ${JSON.stringify(job.result.evaluation ?? {})}`);
    say(`an admin releases it with POST /reef/scenarios/${cfg.scenario}/promote; then run: reef-pi update`);
  }
}

const [command, ...args] = process.argv.slice(2);
const commands = {
  update,
  report,
  evolve,
  status: async () => console.log(JSON.stringify(readJson(STATE, {}), null, 2)),
};
if (!commands[command]) {
  console.error("usage: reef-pi update | report --score S [--feedback T] | evolve \"<ask>\" | status");
  process.exit(2);
}
commands[command](args).catch((e) => {
  console.error(`reef-pi: ${e.message}`);
  process.exit(1);
});
