// The chapter 2 KV-cache calculator for readers of the online book: no Python kernel needed.
//
// kvlib/sizing/web_calculator.py places this script at the end of a <div class="kvcalc">, after
// the form and after the catalog (the JSON that kvlib.sizing's catalog_export() returns, from
// the catalog module). It repeats kvlib's arithmetic (kvlib.sizing.spec and kvlib.sizing.capacity: cache
// bytes, weight bytes, max batch, max context; kvlib.sizing.widget.capacity_report: the GPU
// share) and writes the answer exactly as kvlib.sizing.web_calculator.answer_rows formats it.
// Byte counts are BigInts, exact like Python's integers; the browser tests
// (tests/browser/test_calculator.py) check the displayed text against kvlib for many inputs.
(function () {
  "use strict";
  const root = document.currentScript.parentElement;
  const catalog = JSON.parse(root.querySelector(".kvcalc-data").textContent);
  const models = Object.fromEntries(catalog.models.map((m) => [m.name, m]));
  const GiB = 2 ** 30;

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
      throw new Error(`total number of attention heads (${m.num_heads}) must be divisible by tensor parallel size (${tp})`);
    }
    if (m.kind !== "MLA" && m.num_kv_heads % tp && tp % m.num_kv_heads) {
      throw new Error(`the number of KV heads (${m.num_kv_heads}) must divide or be divisible by tensor parallel size (${tp})`);
    }
    if (pp > m.num_layers) {
      throw new Error(`pipeline_parallel_size (${group(String(pp))}) exceeds the ${group(String(m.num_layers))} layers of ${m.name}: a stage would hold no layer`);
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
  const floatRepr = (x) => (Number.isInteger(x) ? x.toFixed(1) : String(x));

  // ------------------------------------------------ the answer (kvlib.sizing.web_calculator.answer_rows)

  // An integer input as kvlib.sizing.spec.require_int wants it; `limit` mirrors the form's max attribute.
  function integer(key, raw, limit) {
    const value = Number(raw);
    if (raw.trim() === "" || !Number.isInteger(value) || value < 1) {
      throw new Error(`${key} must be an integer >= 1, not ${raw.trim() || "empty"}`);
    }
    if (limit && value > limit) throw new Error(`${key} must be at most ${group(String(limit))} here`);
    return value;
  }

  function gibibytes(key, raw, limit) {
    const value = Number(raw);
    if (raw.trim() === "" || !Number.isFinite(value)) throw new Error(`${key} must be a number of GiB, not ${raw.trim() || "empty"}`);
    if (limit && value > limit) throw new Error(`${key} must be at most ${group(String(limit))} GiB here`);
    return value;
  }

  // Rows [key, label, text] for inputs given as the form's strings; throws an Error with kvlib's message.
  // On more than one GPU the memory is per GPU and the share, max batch and max context are the
  // fullest GPU's (kvlib.sizing.widget.capacity_report).
  function rows(input, limits = {}) {
    const gpuGib = gibibytes("GPU memory", input.gpu_gib, limits.gpu_gib);
    const overheadGib = gibibytes("overhead", input.overhead_gib, limits.overhead_gib);
    const tp = integer("tensor_parallel_size", input.tensor_parallel_size ?? "1", limits.tensor_parallel_size);
    const pp = integer("pipeline_parallel_size", input.pipeline_parallel_size ?? "1", limits.pipeline_parallel_size);
    if (!(gpuGib > 0) || overheadGib < 0) {
      throw new Error(`GPU memory must be positive and overhead non-negative, not ${floatRepr(gpuGib)} and ${floatRepr(overheadGib)} GiB`);
    }
    const gpu = big(Math.trunc(gpuGib * GiB)); // int(gpu_gib * GiB)
    if (gpu < 1n) throw new Error(`GPU memory must be at least one byte, not ${String(gpuGib)} GiB`);
    const m = models[input.model];
    const kv = catalog.kv_dtypes[input.kv_dtype];
    const weightDtype = catalog.kv_dtypes[input.weight_dtype];
    if (!m || !kv || !weightDtype) throw new Error("choose a model, a KV dtype and a weight dtype from the lists");
    const context = integer("context", input.context);
    if (context > m.max_context) {
      throw new Error(`context ${group(String(context))} exceeds ${m.name}'s maximum of ${group(String(m.max_context))} tokens`);
    }
    const batch = integer("batch", input.batch, limits.batch);
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
    const cross = one.cross ? `, of which ${group(one.cross.toString())} B cross-attention` : "";
    const several = gpus > 1;
    const heads = m.kind === "MLA" ? "the MLA latent (replicated on every GPU)" : `${group(String(kvHeadsPerGpu(m, tp)))} of the ${group(String(m.num_kv_heads))} KV heads per layer`;
    const stage = Math.max(...ppLayerRanges(m.num_layers, pp).map(([start, stop]) => stop - start));
    const perGpu = [
      ["per_gpu", "per GPU", `${bytesText(gpuCache)} for ${group(String(batch))} sequences on the fullest of ${group(String(gpus))} GPUs (tensor_parallel_size ${group(String(tp))} x pipeline_parallel_size ${group(String(pp))})`],
      ["kv_heads_per_gpu", "each GPU", `${heads} x ${group(String(stage))} layers`],
    ];
    return [
      ["per_token", "per token", `${group((big(n) * layer).toString())} B = ${n} attention layers x ${group(layer.toString())} B`],
      ["per_sequence", "one sequence", `${bytesText(one.self + one.cross)} at ${group(String(context))} tokens${cross}`],
      ["batch", "the batch", `${bytesText(cache)} for ${group(String(batch))} sequences`],
      ...(several ? perGpu : []),
      ["weights", "weights", `${bytesText(weights)} (${weightDtype.name})${several ? `, ${bytesText(gpuWeights)} per GPU` : ""}`],
      ["gpu_share", "GPU memory", `${fixed(fraction * 100, 1)}% used${several ? " on the fullest GPU" : ""}: ${used <= gpu ? "fits" : "does NOT fit"}`],
      ["max_batch", "max batch", `${group(maxBatch(free, perGpuBytes(m, context, 1, kv, tp, pp)).toString())} sequences of ${group(String(context))} tokens`],
      ["max_context", "max context", `${group(String(maxContext(m, batch, free, kv, tp, pp)))} tokens at batch ${group(String(batch))} (model maximum ${group(String(m.max_context))})`],
    ];
  }

  // ---------------------------------------------------------------- the page

  const form = root.querySelector("form");
  const table = root.querySelector(".kvcalc-answer");
  const error = root.querySelector(".kvcalc-error");
  const limits = {};
  for (const name of ["batch", "gpu_gib", "overhead_gib", "tensor_parallel_size", "pipeline_parallel_size"]) {
    if (form.elements[name]) limits[name] = Number(form.elements[name].max) || 0;
  }

  function update() {
    const input = {};
    for (const element of form.elements) if (element.name) input[element.name] = element.value;
    let answer;
    try {
      answer = rows(input, limits);
    } catch (problem) {
      error.textContent = problem instanceof Error ? problem.message : String(problem);
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
  root.kvcalcRows = (input) => rows(input, limits); // for the browser tests
  update();
  root.dataset.ready = "true";
})();
