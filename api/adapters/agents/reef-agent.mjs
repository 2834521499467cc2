// reef-@AGENT@: keeps @AGENT_NAME@'s harness (rules, skills, prompt templates) and its Reef
// provider in step with a Reef scenario, and sends feedback on the agent's last session.
//   reef-@AGENT@ update                          install the scenario's newest harness release
//   reef-@AGENT@ report --score S [--feedback T] report on the last session's receipts
//   reef-@AGENT@ evolve "<ask>" [--no-wait]      ask Reef for a harness change (POST /reef/train)
//                                                and follow the job until its candidate waits
//   reef-@AGENT@ status                          what is installed
// Written by Reef's installer; the token, when Reef needs one, comes from REEF_API_KEY.
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.dirname(fileURLToPath(import.meta.url));
const cfg = JSON.parse(fs.readFileSync(path.join(ROOT, "config.json"), "utf8"));
const NAME = `reef-${cfg.agent}`;
const STATE = path.join(ROOT, "installed.json");
const LAST_SESSION = path.join(ROOT, "last-session");
const HOME = os.homedir();
const CONFIG_HOME = process.env.XDG_CONFIG_HOME || path.join(HOME, ".config");

// Each agent's own places for Reef's harness tree (harness.json stays with Reef) and the file
// that holds its Reef provider.
const AGENTS = {
  pi: () => {
    const dir = process.env.PI_CODING_AGENT_DIR || path.join(HOME, ".pi", "agent");
    return {
      dir,
      places: [
        ["AGENTS.md", "AGENTS.md"],
        ["skills/", "skills/"],
        ["prompts/", "prompts/"],
        ["extensions/", "extensions/"],
      ],
      configs: [{ file: path.join(dir, "models.json"), write: piProvider }],
    };
  },
  codex: () => {
    const dir = process.env.CODEX_HOME || path.join(HOME, ".codex");
    return {
      dir,
      places: [["AGENTS.md", "AGENTS.md"], ["skills/", "skills/"], ["prompts/", "prompts/"]],
      // the provider in config.toml; the model in the `reef` profile (`codex --profile reef`)
      configs: [
        { file: path.join(dir, "config.toml"), write: codexProvider },
        { file: path.join(dir, "reef.config.toml"), write: codexProfile },
      ],
    };
  },
  "claude-code": () => {
    const dir = process.env.CLAUDE_CONFIG_DIR || path.join(HOME, ".claude");
    // the provider is the wrapper's environment (ANTHROPIC_BASE_URL, ...): no file
    return {
      dir,
      places: [["AGENTS.md", "CLAUDE.md"], ["skills/", "skills/"], ["prompts/", "commands/"]],
      configs: [],
    };
  },
  opencode: () => {
    const dir = path.join(CONFIG_HOME, "opencode");
    return {
      dir,
      places: [["AGENTS.md", "AGENTS.md"], ["skills/", "skill/"], ["prompts/", "command/"]],
      configs: [{ file: path.join(dir, "opencode.json"), write: opencodeProvider }],
    };
  },
};
const AGENT = AGENTS[cfg.agent]();

const sha256 = (data) => createHash("sha256").update(data).digest("hex");
const say = (msg) => console.log(`${NAME}: ${msg}`);
const readText = (file) => (fs.existsSync(file) ? fs.readFileSync(file, "utf8") : "");
const readJson = (file, fallback) => {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8"));
  } catch {
    return fallback;
  }
};

function writeAtomic(file, data) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.${NAME}-${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

// --- provider entries --------------------------------------------------------------------
const BEGIN = "# >>> reef provider (written by reef-codex update; edits here are replaced) >>>";
const END = "# <<< reef provider <<<";
const toml = (s) => JSON.stringify(s); // a TOML basic string is a JSON string for these values

function codexBlock() {
  return [
    BEGIN,
    "[model_providers.reef]",
    'name = "Reef"',
    `base_url = ${toml(`${cfg.url}/v1`)}`,
    'wire_api = "responses"',
    'env_key = "REEF_API_KEY"',
    `http_headers = { "x-reef-scenario" = ${toml(cfg.scenario)} }`,
    'env_http_headers = { "x-reef-session-id" = "REEF_SESSION" }',
    "request_max_retries = 1",
    "stream_max_retries = 0",
    END,
    "",
  ].join("\n");
}

// The `reef` profile: Reef's own file, written whole.
function codexProfile() {
  return [
    "# written by reef-codex update: `codex --profile reef` runs on the Reef provider",
    `model = ${toml(cfg.model)}`,
    'model_provider = "reef"',
    `model_context_window = ${cfg.context_window}`,
    "",
  ].join("\n");
}

// Codex's config.toml keeps whatever else it holds; the reef block is replaced in place, or
// appended (tables only, so it never captures the file's top-level keys).
function codexProvider(text) {
  const block = codexBlock();
  const start = text.indexOf(BEGIN);
  const end = text.indexOf(END);
  if (start >= 0 && end > start) return text.slice(0, start) + block + text.slice(end + END.length + 1);
  return `${text}${text && !text.endsWith("\n") ? "\n" : ""}${text ? "\n" : ""}${block}`;
}

// pi's models.json keeps its other providers; pi reads the key and the session header from
// the environment variables they name.
function piProvider(text) {
  let models = {};
  try {
    models = text ? JSON.parse(text) : {};
  } catch {
    throw new Error("pi's models.json is not JSON: fix or remove it, then rerun");
  }
  const reef = {
    baseUrl: `${cfg.url}/v1`,
    api: "openai-completions",
    apiKey: "REEF_API_KEY",
    headers: { "x-reef-scenario": cfg.scenario, "x-reef-session-id": "REEF_SESSION" },
    compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
    models: [{ id: cfg.model, contextWindow: cfg.context_window, maxTokens: cfg.max_tokens }],
  };
  models.providers = { ...(models.providers ?? {}), reef };
  return `${JSON.stringify(models, null, 2)}\n`;
}

function opencodeEntry() {
  return {
    npm: "@ai-sdk/openai-compatible",
    name: "Reef",
    options: {
      baseURL: `${cfg.url}/v1`,
      apiKey: "{env:REEF_API_KEY}",
      headers: { "x-reef-scenario": cfg.scenario, "x-reef-session-id": "{env:REEF_SESSION}" },
    },
    models: {
      [cfg.model]: { name: cfg.model, tool_call: true, limit: { context: cfg.context_window, output: cfg.max_tokens } },
    },
  };
}

function opencodeProvider(text) {
  let config = {};
  try {
    config = text ? JSON.parse(text) : {};
  } catch {
    throw new Error("opencode.json is not JSON: fix or remove it, then rerun");
  }
  config.$schema ??= "https://opencode.ai/config.json";
  config.provider = { ...(config.provider ?? {}), reef: opencodeEntry() };
  return `${JSON.stringify(config, null, 2)}\n`;
}

function configsIntact() {
  for (const { file, write } of AGENT.configs) {
    const text = readText(file);
    try {
      if (write(text) !== text) return false;
    } catch {
      return false;
    }
  }
  return true;
}

// --- Reef's API ------------------------------------------------------------------------------
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
  for (const [prefix, dest] of AGENT.places) {
    if (harnessPath === prefix || (prefix.endsWith("/") && harnessPath.startsWith(prefix))) {
      return path.join(AGENT.dir, dest + harnessPath.slice(prefix.length));
    }
  }
  return null;
}

function intact(state) {
  for (const [file, digest] of Object.entries(state.files ?? {})) {
    if (!fs.existsSync(file) || sha256(fs.readFileSync(file)) !== digest) return false;
  }
  return configsIntact();
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
  for (const { file, write } of AGENT.configs) {
    const text = readText(file);
    const updated = write(text);
    if (updated !== text) writeAtomic(file, updated);
  }
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
  if (!fs.existsSync(LAST_SESSION)) throw new Error(`no session yet: run ${cfg.bin} through ${NAME}'s wrapper first`);
  const session = fs.readFileSync(LAST_SESSION, "utf8").trim();
  const s = await api("GET", `/reef/scenarios/${encodeURIComponent(cfg.scenario)}/sessions/${encodeURIComponent(session)}`);
  const references = s.data.map((r) => r.id);
  if (references.length === 0) throw new Error(`session ${session} has no records`);
  const body = { references };
  if (score !== undefined) body.score = Number(score);
  if (feedback !== undefined) body.feedback = feedback;
  const r = await api("POST", "/reef/report", body);
  say(`reported on ${references.length} receipts of session ${session}: ${r.id ?? "ok"}`);
}

async function evolve(args) {
  const wait = !args.includes("--no-wait");
  const text = args.filter((a) => a !== "--no-wait").join(" ").trim();
  if (!text) throw new Error(`evolve needs an ask: ${NAME} evolve "when I ask you to fix a bug, ..."`);
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
    say(`candidate ${job.candidate_id} waits for review: ${JSON.stringify(job.result.diff ?? {})}`);
    say(`evaluation: ${JSON.stringify(job.result.evaluation ?? {})}`);
    say(`an admin releases it with POST /reef/scenarios/${cfg.scenario}/promote; then run: ${NAME} update`);
  }
}

const [command, ...args] = process.argv.slice(2);
const commands = {
  update,
  report,
  evolve,
  status: async () => console.log(JSON.stringify({ agent: cfg.agent, ...readJson(STATE, {}) }, null, 2)),
};
if (!commands[command]) {
  console.error(`usage: ${NAME} update | report --score S [--feedback T] | evolve "<ask>" | status`);
  process.exit(2);
}
commands[command](args).catch((e) => {
  console.error(`${NAME}: ${e.message}`);
  process.exit(1);
});
