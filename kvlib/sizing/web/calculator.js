// The chapter 2 KV-cache calculator for readers of the online book: no Python kernel needed.
//
// kvlib/sizing/web_calculator.py places this script at the end of a <div class="kvcalc">, after
// the form and after the catalog (the JSON that kvlib.sizing's catalog_export() returns, from
// the catalog module). It repeats kvlib's arithmetic (kvlib.sizing.spec and kvlib.sizing.capacity: cache
// bytes, weight bytes, max batch, max context; kvlib.sizing.widget.capacity_report: the GPU
// share) and writes the answer exactly as kvlib.sizing.web_calculator.answer_rows formats it.
// Byte counts are BigInts, exact like Python's integers; the browser tests
// (tests/browser/test_calculator.py) check the displayed text against kvlib for many inputs.
// On a page of the Japanese edition (<html lang="ja">) the form, the rows and the messages are
// shown in Japanese (the glossary's terms, book/glossary.md) with the same numbers
// (tests/browser/test_calculator_ja.py); root.kvcalcRows answers in English unless asked for "ja".
(function () {
  "use strict";
  const root = document.currentScript.parentElement;
  const catalog = JSON.parse(root.querySelector(".kvcalc-data").textContent);
  // Maps, so that a name such as "__proto__" or "toString" finds no model (an object's own
  // prototype would answer for it).
  const models = new Map(catalog.models.map((m) => [m.name, m]));
  const dtypes = new Map(Object.entries(catalog.kv_dtypes));
  const GiB = 2 ** 30;
  const japanese = (document.documentElement.lang || "").split("-")[0] === "ja";

  // ------------------------------------------------ the words, in English (kvlib's) and in Japanese

  // The form's words, as kvlib.sizing.web_calculator.calculator_html writes them -> Japanese.
  const FORM_JA = {
    "KV-cache calculator": "KVキャッシュ計算機",
    " (it runs in your browser: no Python needed)": "（ブラウザ上で動きます。Python は不要です）",
    model: "モデル",
    "context (tokens)": "文脈長（トークン）",
    "batch (sequences)": "バッチサイズ（シーケンス数）",
    "KV dtype": "KVキャッシュのデータ型",
    "GPU memory per GPU (GiB)": "GPUあたりのメモリ（GiB）",
    weights: "重みのデータ型",
    "overhead (GiB)": "オーバーヘッド（GiB）",
    "--tensor-parallel-size (GPUs per layer)": "--tensor-parallel-size（1層を分担するGPU数）",
    "--pipeline-parallel-size (stages)": "--pipeline-parallel-size（ステージ数）",
  };

  // The rows' labels (kvlib.sizing.web_calculator.answer_rows) by key -> [English, Japanese].
  const LABELS = {
    per_token: ["per token", "トークンあたり"],
    per_sequence: ["one sequence", "1シーケンス"],
    batch: ["the batch", "バッチ全体"],
    per_gpu: ["per GPU", "GPUあたり"],
    kv_heads_per_gpu: ["each GPU", "各GPU"],
    weights: ["weights", "重み"],
    gpu_share: ["GPU memory", "GPUメモリ"],
    max_batch: ["max batch", "最大バッチサイズ"],
    max_context: ["max context", "最大文脈長"],
  };

  // The fields the messages name (kvlib's words) -> Japanese; identifiers stay as they are.
  const FIELDS_JA = { "GPU memory": "GPUメモリ", overhead: "オーバーヘッド", context: "文脈長", batch: "バッチサイズ" };
  const subject = (key) => (FIELDS_JA[key] ? `${FIELDS_JA[key]}は` : `${key} は`);
  const inputJa = (raw) => (raw === "empty" ? "空欄" : raw);

  // Each message the calculator can show: [English (kvlib's, word for word), Japanese], from the
  // same arguments (numbers already formatted, so both say kvlib's numbers).
  const MESSAGES = {
    not_integer: (key, raw) => [
      `${key} must be an integer >= 1, not ${raw}`,
      `${subject(key)}1以上の整数で指定してください（入力: ${inputJa(raw)}）`,
    ],
    too_large: (key, limit) => [`${key} must be at most ${limit} here`, `${subject(key)}ここでは${limit}以下にしてください`],
    too_many: (key, limit, raw) => [
      `${key} must be at most ${limit} (kvlib's bound on counts), not ${raw}`,
      `${subject(key)}${limit}以下にしてください（kvlibの上限、入力: ${raw}）`,
    ],
    not_gib: (key, raw) => [
      `${key} must be a number of GiB, not ${raw}`,
      `${subject(key)}GiB単位の数値で指定してください（入力: ${inputJa(raw)}）`,
    ],
    too_many_gib: (key, limit) => [
      `${key} must be at most ${limit} GiB here`,
      `${subject(key)}ここでは${limit} GiB以下にしてください`,
    ],
    memory_sign: (gpu, overhead) => [
      `GPU memory must be positive and overhead non-negative, not ${gpu} and ${overhead} GiB`,
      `GPUメモリは正の値、オーバーヘッドは負でない値にしてください（入力: ${gpu} GiBと${overhead} GiB）`,
    ],
    memory_byte: (gpu) => [
      `GPU memory must be at least one byte, not ${gpu} GiB`,
      `GPUメモリが1バイトに届きません（入力: ${gpu} GiB）`,
    ],
    choose: () => [
      "choose a model, a KV dtype and a weight dtype from the lists",
      "モデル、KVキャッシュのデータ型、重みのデータ型は一覧から選んでください",
    ],
    long_context: (context, name, most) => [
      `context ${context} exceeds ${name}'s maximum of ${most} tokens`,
      `文脈長${context}は ${name} の最大${most}トークンを超えています`,
    ],
    heads_tp: (heads, tp) => [
      `total number of attention heads (${heads}) must be divisible by tensor parallel size (${tp})`,
      `アテンションヘッドの総数（${heads}）はテンソル並列数（${tp}）で割り切れる必要があります`,
    ],
    kv_heads_tp: (heads, tp) => [
      `the number of KV heads (${heads}) must divide or be divisible by tensor parallel size (${tp})`,
      `KVヘッド数（${heads}）はテンソル並列数（${tp}）の約数か倍数である必要があります`,
    ],
    stages: (pp, layers, name) => [
      `pipeline_parallel_size (${pp}) exceeds the ${layers} layers of ${name}: a stage would hold no layer`,
      `pipeline_parallel_size（${pp}）が ${name} の層数${layers}を超えています: 層を持たないステージができます`,
    ],
  };

  // Throws an Error whose message is kvlib's English one; its .ja is the Japanese text.
  function fail(id, ...args) {
    const [english, ja] = MESSAGES[id](...args);
    const error = new Error(english);
    error.ja = ja;
    throw error;
  }

  // ------------------------------------------------ kvlib.sizing.spec and .capacity, in BigInt bytes

  const big = BigInt;
  const ceilDiv = (a, b) => (a + b - 1n) / b; // for a >= 0, b > 0, like Python's ceil_div(a, b)

  // KVDtype.vector_bytes: bits per value, plus (int8/int4) one scale and zero point per group.
  function vectorBytes(dtype, length) {
    const data = ceilDiv(big(length) * big(dtype.bits), 8n);
    if (!dtype.group_size) return data;
    return data + ceilDiv(big(length), big(dtype.group_size)) * big(dtype.meta_bytes);
  }

  // token_layer_bytes: one token in one attention layer (K and V per KV head, or one MLA latent).
  const tokenLayerBytes = (m, dtype) => big(m.vectors_per_token_per_layer) * vectorBytes(dtype, m.values_per_vector);

  // cache_size: a sliding-window layer keeps at most its window; every attention layer of an
  // encoder-decoder model also keeps the cross-attention K/V of all encoder positions.
  function cacheSize(m, context, batch, dtype) {
    let selfTokens = 0;
    for (const window of m.sliding_windows) selfTokens += window === null ? context : Math.min(context, window);
    const crossTokens = m.attention_layers.length * m.cross_attention_tokens;
    const perToken = big(batch) * tokenLayerBytes(m, dtype);
    return { self: perToken * big(selfTokens), cross: perToken * big(crossTokens) };
  }

  function cacheBytes(m, context, batch, dtype) {
    const size = cacheSize(m, context, batch, dtype);
    return size.self + size.cross;
  }

  // weight_bytes: parameters x bits (integer formats add their group scales, as for the cache).
  function weightBytes(numParameters, dtype) {
    if (!dtype.group_size) return (big(numParameters) * big(dtype.bits)) / 8n;
    return vectorBytes(dtype, numParameters);
  }

  // kvlib.sizing.parallel: vLLM's layout over tensor_parallel_size x pipeline_parallel_size GPUs.
  // check_parallel: what vLLM refuses, with its reason (the same words as kvlib's).
  function checkParallel(m, tp, pp) {
    if (m.num_heads % tp) {
      fail("heads_tp", m.num_heads, tp);
    }
    if (m.kind !== "MLA" && m.num_kv_heads % tp && tp % m.num_kv_heads) {
      fail("kv_heads_tp", m.num_kv_heads, tp);
    }
    if (pp > m.num_layers) {
      fail("stages", group(String(pp)), group(String(m.num_layers)), m.name);
    }
  }

  // kv_heads_per_gpu: a rank's share of the KV heads, one replicated head when TP exceeds them;
  // an MLA latent is whole on every rank.
  const kvHeadsPerGpu = (m, tp) => (m.kind === "MLA" ? 1 : Math.max(1, Math.floor(m.num_kv_heads / tp)));

  // pp_layer_ranges (vLLM's get_pp_indices): num_layers // pp each, the remainder one layer each
  // to the stages before the last, from the second-to-last backwards.
  function ppLayerRanges(numLayers, pp) {
    const sizes = new Array(pp).fill(Math.floor(numLayers / pp));
    for (let i = 2; i < (numLayers % pp) + 2; i++) sizes[pp - i] += 1;
    let start = 0;
    return sizes.map((size) => [start, (start += size)]);
  }

  // per_gpu_bytes: the cache of the fullest GPU, one TP rank of the largest PP stage (tp = pp = 1:
  // cacheBytes). A layer keeps its tokens (up to its window) plus the encoder's positions.
  function perGpuBytes(m, context, batch, dtype, tp, pp) {
    const heads = kvHeadsPerGpu(m, tp);
    const layer = m.kind === "MLA" ? tokenLayerBytes(m, dtype) : 2n * big(heads) * vectorBytes(dtype, m.values_per_vector);
    let most = 0n;
    for (const [start, stop] of ppLayerRanges(m.num_layers, pp)) {
      let tokens = 0;
      m.attention_layers.forEach((index, i) => {
        if (index < start || index >= stop) return;
        const window = m.sliding_windows[i];
        tokens += (window === null ? context : Math.min(context, window)) + m.cross_attention_tokens;
      });
      const bytes = big(batch) * layer * big(tokens);
      if (bytes > most) most = bytes;
    }
    return most;
  }

  // max_batch: sequences whose caches fit in what the weights and the overhead leave free.
  const maxBatch = (free, perSequence) => (free < 0n ? 0n : free / perSequence);

  // max_context: cache size never shrinks as the context grows, so bisect for the last that fits
  // (on one GPU of the layout: kvlib.sizing.capacity.max_context).
  function maxContext(m, batch, free, dtype, tp, pp) {
    if (free < perGpuBytes(m, 1, batch, dtype, tp, pp)) return 0;
    let low = 1;
    let high = m.max_context;
    while (low < high) {
      const mid = Math.floor((low + high + 1) / 2);
      if (perGpuBytes(m, mid, batch, dtype, tp, pp) <= free) low = mid;
      else high = mid - 1;
    }
    return low;
  }

  // ---------------------------------------------------------------- Python's number formatting

  // f"{n:,}": thousands separated by commas.
  const group = (digits) => digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");

  // f"{x:,.{d}f}" for x >= 0 (f"{x:,.{d}%}" is fixed(x * 100, d) + "%", as Python multiplies
  // first). Python rounds the exact binary value of x half to even, while toFixed rounds halves
  // up (0.0625 GiB: Python 0.062, toFixed 0.063), so write x = num / den exactly (den a power
  // of two) and round with integers.
  function fixed(x, d) {
    if (!Number.isFinite(x) || x < 0) throw new Error(`cannot format ${x}`); // Infinity would never become an integer
    let num = x;
    let den = 1n;
    while (!Number.isInteger(num)) {
      num *= 2; // exact: only the exponent changes
      den *= 2n;
    }
    const scaled = big(num) * 10n ** big(d);
    let q = scaled / den;
    const twiceRest = 2n * (scaled % den);
    if (twiceRest > den || (twiceRest === den && q % 2n === 1n)) q += 1n;
    const s = q.toString().padStart(d + 1, "0");
    return d ? group(s.slice(0, -d)) + "." + s.slice(-d) : group(s);
  }

  // kvlib.sizing.capacity.format_bytes_gib: f"{n:,} B ({n / GiB:,.3f} GiB)"; n < 2**53, so Number(n) is exact.
  const bytesText = (n) => `${group(n.toString())} B (${fixed(Number(n) / GiB, 3)} GiB)`;

  // repr() of a Python float in the error messages: 80 -> "80.0".
  const floatRepr = (x) => (Object.is(x, -0) ? "-0.0" : Number.isInteger(x) ? x.toFixed(1) : String(x));

  // ------------------------------------------------ the answer (kvlib.sizing.web_calculator.answer_rows)

  // A form value as text: a string as it is, a number or a BigInt as String() writes it; anything
  // else (undefined, null, a bool, an object) is refused with a message naming the field, as kvlib
  // refuses what is not a number.
  function text(key, raw, id) {
    if (typeof raw === "string") return raw.trim();
    if (typeof raw === "number" || typeof raw === "bigint") return String(raw);
    if (raw === undefined) return "";
    if (raw === null) fail(id, key, "null");
    fail(id, key, typeof raw === "object" ? `an ${Array.isArray(raw) ? "array" : "object"}` : String(raw));
  }

  // What a refused value looks like in a message: one line, cut as kvlib.checks cuts it.
  const shown = (value) => {
    const line = /^[\x20-\x7e]*$/.test(value) ? value : JSON.stringify(value);
    return line.length > 100 ? `${line.slice(0, 100)}...` : line;
  };

  // An integer input as kvlib.checks.require_int wants it: decimal digits (Python's int(), not
  // JavaScript's Number(): "0x10", "1e3", "NaN" and "Infinity" are not integers), read exactly as a
  // BigInt; `limit` mirrors the form's max attribute. Kept below 2**53, so a Number from here on is exact.
  const INTEGER = /^[+-]?[0-9]+$/;
  const MOST = 1_000_000_000_000; // kvlib.sizing's bound on counts (MAX_COUNT)
  function integer(key, raw, limit) {
    const digits = text(key, raw, "not_integer");
    if (!INTEGER.test(digits)) fail("not_integer", key, digits === "" ? "empty" : shown(digits));
    const value = big(digits);
    if (value < 1n) fail("not_integer", key, value.toString());
    if (limit && value > big(limit)) fail("too_large", key, group(String(limit)));
    if (value > big(MOST)) fail("too_many", key, group(String(MOST)), shown(value.toString()));
    return Number(value);
  }

  // A GiB input as Python's float() reads a decimal number ("0x10" is not one); NaN and the
  // infinities are refused (kvlib wants finite GiB).
  const DECIMAL = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/;
  function gibibytes(key, raw, limit) {
    const number = text(key, raw, "not_gib");
    const value = Number(number);
    if (!DECIMAL.test(number) || !Number.isFinite(value)) fail("not_gib", key, number === "" ? "empty" : shown(number));
    if (limit && value > limit) fail("too_many_gib", key, group(String(limit)));
    return value;
  }

  // Rows [key, label, text] for inputs given as the form's strings, in English (kvlib's words) or in
  // Japanese (language "ja": the same numbers); throws an Error with kvlib's message (its .ja: Japanese).
  // On more than one GPU the memory is per GPU and the share, max batch and max context are the
  // fullest GPU's (kvlib.sizing.widget.capacity_report).
  function rows(given, limits = {}, language = "en") {
    // only the input's own fields count (not what its prototype would answer for)
    const input = new Map(given !== null && typeof given === "object" ? Object.entries(given) : []);
    const gpuGib = gibibytes("GPU memory", input.get("gpu_gib"), limits.gpu_gib);
    const overheadGib = gibibytes("overhead", input.get("overhead_gib"), limits.overhead_gib);
    // a form without the TP/PP fields (an older page) means one GPU; a null is refused as kvlib refuses None
    const layout = (key) => (input.has(key) && input.get(key) !== undefined ? input.get(key) : "1");
    const tp = integer("tensor_parallel_size", layout("tensor_parallel_size"), limits.tensor_parallel_size);
    const pp = integer("pipeline_parallel_size", layout("pipeline_parallel_size"), limits.pipeline_parallel_size);
    if (!(gpuGib > 0) || overheadGib < 0) {
      fail("memory_sign", floatRepr(gpuGib), floatRepr(overheadGib));
    }
    const gpu = big(Math.trunc(gpuGib * GiB)); // int(gpu_gib * GiB)
    if (gpu < 1n) fail("memory_byte", String(gpuGib));
    const m = models.get(input.get("model"));
    const kv = dtypes.get(input.get("kv_dtype"));
    const weightDtype = dtypes.get(input.get("weight_dtype"));
    if (!m || !kv || !weightDtype) fail("choose");
    const context = integer("context", input.get("context"));
    if (context > m.max_context) {
      fail("long_context", group(String(context)), m.name, group(String(m.max_context)));
    }
    const batch = integer("batch", input.get("batch"), limits.batch);
    checkParallel(m, tp, pp);

    const gpus = tp * pp;
    const overhead = big(Math.trunc(overheadGib * GiB));
    const weights = weightBytes(m.num_parameters, weightDtype);
    const gpuWeights = ceilDiv(weights, big(gpus));
    const one = cacheSize(m, context, 1, kv);
    const cache = cacheBytes(m, context, batch, kv);
    const gpuCache = perGpuBytes(m, context, batch, kv, tp, pp);
    const free = gpu - gpuWeights - overhead;
    const used = gpuWeights + overhead + gpuCache;
    const fraction = Number(used) / Number(gpu); // exact operands, so rounded as Python's int / int
    const layer = tokenLayerBytes(m, kv);
    const n = m.attention_layers.length;
    const several = gpus > 1;
    const stage = Math.max(...ppLayerRanges(m.num_layers, pp).map(([start, stop]) => stop - start));
    // the numbers as the rows write them, the same in both languages
    const N = {
      perToken: group((big(n) * layer).toString()),
      layer: group(layer.toString()),
      sequence: bytesText(one.self + one.cross),
      cross: group(one.cross.toString()),
      context: group(String(context)),
      batch: group(String(batch)),
      cache: bytesText(cache),
      gpuCache: bytesText(gpuCache),
      gpus: group(String(gpus)),
      tp: group(String(tp)),
      pp: group(String(pp)),
      headsPerGpu: group(String(kvHeadsPerGpu(m, tp))),
      kvHeads: group(String(m.num_kv_heads)),
      stage: group(String(stage)),
      weights: bytesText(weights),
      gpuWeights: bytesText(gpuWeights),
      share: fixed(fraction * 100, 1),
      maxBatch: group(maxBatch(free, perGpuBytes(m, context, 1, kv, tp, pp)).toString()),
      maxContext: group(String(maxContext(m, batch, free, kv, tp, pp))),
      modelMax: group(String(m.max_context)),
    };
    const fits = used <= gpu;
    const mla = m.kind === "MLA";
    const text = language === "ja"
      ? {
          per_token: `${N.perToken} B = アテンション層${n}層 × ${N.layer} B`,
          per_sequence: `${N.sequence}、${N.context}トークン分${one.cross ? `（うち交差注意 ${N.cross} B）` : ""}`,
          batch: `${N.cache}、${N.batch}シーケンス分`,
          per_gpu: `${N.gpuCache}、${N.batch}シーケンス分（${N.gpus}基のGPUのうち最も使用量の多いGPU、tensor_parallel_size ${N.tp} × pipeline_parallel_size ${N.pp}）`,
          kv_heads_per_gpu: `${mla ? "MLAの潜在ベクトル（全GPUに複製）" : `各層のKVヘッド${N.headsPerGpu}個（全${N.kvHeads}個中）`} × ${N.stage}層`,
          weights: `${N.weights} (${weightDtype.name})${several ? `、GPUあたり ${N.gpuWeights}` : ""}`,
          gpu_share: `${N.share}%を使用${several ? "（最も使用量の多いGPU）" : ""}: ${fits ? "収まります" : "収まりません"}`,
          max_batch: `${N.maxBatch}シーケンス（各${N.context}トークン）`,
          max_context: `${N.maxContext}トークン（バッチサイズ${N.batch}のとき、モデルの最大は${N.modelMax}）`,
        }
      : {
          per_token: `${N.perToken} B = ${n} attention layers x ${N.layer} B`,
          per_sequence: `${N.sequence} at ${N.context} tokens${one.cross ? `, of which ${N.cross} B cross-attention` : ""}`,
          batch: `${N.cache} for ${N.batch} sequences`,
          per_gpu: `${N.gpuCache} for ${N.batch} sequences on the fullest of ${N.gpus} GPUs (tensor_parallel_size ${N.tp} x pipeline_parallel_size ${N.pp})`,
          kv_heads_per_gpu: `${mla ? "the MLA latent (replicated on every GPU)" : `${N.headsPerGpu} of the ${N.kvHeads} KV heads per layer`} x ${N.stage} layers`,
          weights: `${N.weights} (${weightDtype.name})${several ? `, ${N.gpuWeights} per GPU` : ""}`,
          gpu_share: `${N.share}% used${several ? " on the fullest GPU" : ""}: ${fits ? "fits" : "does NOT fit"}`,
          max_batch: `${N.maxBatch} sequences of ${N.context} tokens`,
          max_context: `${N.maxContext} tokens at batch ${N.batch} (model maximum ${N.modelMax})`,
        };
    const keys = ["per_token", "per_sequence", "batch", ...(several ? ["per_gpu", "kv_heads_per_gpu"] : []), "weights", "gpu_share", "max_batch", "max_context"];
    return keys.map((key) => [key, LABELS[key][language === "ja" ? 1 : 0], text[key]]);
  }

  // ---------------------------------------------------------------- the page

  const form = root.querySelector("form");
  const table = root.querySelector(".kvcalc-answer");
  const error = root.querySelector(".kvcalc-error");
  const limits = {};
  for (const name of ["batch", "gpu_gib", "overhead_gib", "tensor_parallel_size", "pipeline_parallel_size"]) {
    if (form.elements[name]) limits[name] = Number(form.elements[name].max) || 0;
  }

  // On a Japanese page, the words of the form that calculator_html wrote (the title and each
  // label's own text, not its control) become Japanese; a word the table lacks stays as it is.
  function translateForm() {
    const title = root.querySelector("p > b");
    const words = [...(title ? [title, title.nextSibling] : []), ...[...form.querySelectorAll("label")].map((l) => l.firstChild)];
    for (const node of words) {
      if (node && node.nodeType === Node.TEXT_NODE && FORM_JA[node.nodeValue] !== undefined) node.nodeValue = FORM_JA[node.nodeValue];
      else if (node && node.nodeType === Node.ELEMENT_NODE && FORM_JA[node.textContent] !== undefined) node.textContent = FORM_JA[node.textContent];
    }
  }

  // The message shown for a refused input: kvlib's words, or their Japanese on a Japanese page
  // (a message without a translation keeps kvlib's words after a Japanese prefix).
  function message(problem) {
    const english = problem instanceof Error ? problem.message : String(problem);
    if (!japanese) return english;
    return problem && problem.ja ? problem.ja : `入力エラー: ${english}`;
  }

  function update() {
    const input = {};
    for (const element of form.elements) if (element.name) input[element.name] = element.value;
    let answer;
    try {
      answer = rows(input, limits, japanese ? "ja" : "en");
    } catch (problem) {
      error.textContent = message(problem);
      table.hidden = true;
      return;
    }
    error.textContent = "";
    table.hidden = false;
    table.tBodies[0].replaceChildren(...answer.map(([key, label, text]) => {
      const tr = document.createElement("tr");
      tr.dataset.out = key;
      tr.append(document.createElement("th"), document.createElement("td"));
      tr.cells[0].textContent = label;
      tr.cells[1].textContent = text;
      return tr;
    }));
  }

  form.addEventListener("input", update);
  form.addEventListener("change", update);
  form.addEventListener("submit", (event) => event.preventDefault());
  // for the browser tests: the rows in English (kvlib's words) or, with language "ja", in Japanese
  root.kvcalcRows = (input, language = "en") => rows(input, limits, language);
  if (japanese) translateForm();
  update();
  root.dataset.ready = "true";
})();
