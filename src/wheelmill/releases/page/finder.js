// The coverage page's finder (wheelmill.releases.coverage_page): a package, torch,
// accelerator, Python and platform picked, each narrowed to what the matrix has; then, for
// each variant those name, the exact pip and uv lines where a file exists, or why none does
// and how often installers asked for it. The picks are the URL's query, so an answer is a link.
// Data is only ever written as text (textContent), never as HTML.
"use strict";

(function () {
  const PICKS = ["recipe", "torch", "accelerator", "python", "platform"];

  function element(tag, text, attributes) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
    return node;
  }

  function unique(values) {
    return Array.from(new Set(values));
  }

  // 2.14.1 after 2.9.1; "3.10" after "3.9".
  function versionParts(version) {
    return String(version).split(/[.+]/).map((part) => (/^\d+$/.test(part) ? Number(part) : part));
  }

  function compareVersions(a, b) {
    const left = versionParts(a);
    const right = versionParts(b);
    for (let i = 0; i < Math.max(left.length, right.length); i += 1) {
      if (left[i] === undefined) return -1;
      if (right[i] === undefined) return 1;
      if (left[i] !== right[i]) return left[i] < right[i] ? -1 : 1;
    }
    return 0;
  }

  // cpu first, then each family by its toolkit's version.
  function compareAccelerators(a, b) {
    const [familyA, toolkitA] = a.split(" ");
    const [familyB, toolkitB] = b.split(" ");
    if (familyA !== familyB) return familyA === "cpu" ? -1 : familyB === "cpu" ? 1 : familyA < familyB ? -1 : 1;
    return compareVersions(toolkitA || "0", toolkitB || "0");
  }

  // PEP 503's normalized name.
  function normalize(name) {
    return String(name).toLowerCase().replace(/[-_.]+/g, "-");
  }

  // A wheel's name and version from its file name (PEP 427: name-version[-build]-python-abi-platform.whl;
  // the name has "_" where the project has "-").
  function parseWheel(filename) {
    const parts = filename.replace(/\.whl$/, "").split("-");
    return { project: normalize(parts[0]), version: parts[1] };
  }

  // The index's root: the served index's URL where the data names it, else this page's
  // parent (the page lives at <index>/coverage/).
  function indexUrl(data) {
    const root = data.index_url || new URL("../", window.location.href).href;
    return root.replace(/\/+$/, "");
  }

  class Finder {
    constructor(data, form, answer) {
      this.data = data;
      this.form = form;
      this.answer = answer;
      this.spots = new Map(data.spots.map((s) => [`${s.recipe}|${s.variant}|${s.python}`, s]));
      this.pythons = new Map(data.variants.map((v) => [v.name, new Set()]));
      for (const spot of data.spots) {
        if (spot.cell !== null && this.pythons.has(spot.variant)) this.pythons.get(spot.variant).add(spot.python);
      }
    }

    // Each select's values, narrowed by the picks before it; a pick that is not among them
    // becomes the first that is.
    narrow(wanted) {
      const lists = { recipe: this.data.recipes.slice() };
      const picks = {};
      const take = (name, values) => {
        lists[name] = values;
        picks[name] = values.includes(wanted[name]) ? wanted[name] : values[0];
        return picks[name];
      };
      take("recipe", lists.recipe);
      let variants = this.data.variants;
      const torch = take("torch", unique(variants.map((v) => v.torch)).sort(compareVersions).reverse());
      variants = variants.filter((v) => v.torch === torch);
      const accelerator = take("accelerator", unique(variants.map((v) => v.accelerator)).sort(compareAccelerators));
      variants = variants.filter((v) => v.accelerator === accelerator);
      const pythons = unique(variants.flatMap((v) => Array.from(this.pythons.get(v.name))));
      const python = take("python", pythons.sort(compareVersions));
      variants = variants.filter((v) => this.pythons.get(v.name).has(python));
      const platform = take("platform", unique(variants.map((v) => v.platform)));
      variants = variants.filter((v) => v.platform === platform);
      return { lists, picks, variants };
    }

    show(wanted) {
      const found = this.narrow(wanted);
      for (const name of PICKS) this.fill(this.form.elements[name], found.lists[name], found.picks[name]);
      const query = new URLSearchParams(PICKS.map((name) => [name, found.picks[name]]));
      window.history.replaceState(null, "", `?${query}`);
      this.answer.replaceChildren(...found.variants.map((v) => this.answerFor(found.picks, v)), this.link(query));
      this.answer.dataset.ready = "1";
    }

    fill(select, values, chosen) {
      select.replaceChildren(...values.map((value) => element("option", value, { value })));
      select.value = chosen;
    }

    picked() {
      return Object.fromEntries(PICKS.map((name) => [name, this.form.elements[name].value]));
    }

    answerFor(picks, variant) {
      const spot = this.spots.get(`${picks.recipe}|${variant.name}|${picks.python}`);
      const box = element("article", null, { class: `answer ${spot.mark}` });
      const archs = variant.archs ? `, archs ${variant.archs}` : "";
      box.append(element("h3", `${variant.name}: channel ${spot.channel || variant.channel}${archs}`));
      if (spot.mark === "built" || spot.mark === "served") this.installs(box, spot, picks);
      else this.notBuilt(box, spot, picks);
      return box;
    }

    installs(box, spot, picks) {
      const how = spot.mark === "built" ? "built by its cell's job" : "served: its ABI group's one build";
      box.append(element("p", `${how}: ${spot.files.map((f) => f.filename).join(", ")}`, { class: "verdict" }));
      const stages = spot.files.flatMap((f) => Object.entries(f.gpu));
      const gpu = stages.map(([runner, outcome]) => `${runner || "GPU"} ${outcome}`);
      if (gpu.length) box.append(element("p", `GPU stage: ${gpu.join(", ")}`));
      const simple = `${indexUrl(this.data)}/${spot.channel}/simple/`;
      const wanted = unique(spot.files.map((f) => parseWheel(f.filename)).map((w) => `${w.project}==${w.version}`));
      const pip = `pip install --index-url ${simple} ${wanted.join(" ")}`;
      const uv = `uv venv --python ${picks.python}\nuv pip install --index-url ${simple} ${wanted.join(" ")}`;
      box.append(element("p", "With pip:"), this.code(pip, "pip"));
      box.append(element("p", "With uv (its pip interface installs into a venv, made first):"), this.code(uv, "uv"));
    }

    code(text, kind) {
      const pre = element("pre", null, { class: `install ${kind}` });
      pre.append(element("code", text));
      return pre;
    }

    notBuilt(box, spot, picks) {
      box.append(element("p", `not built: ${this.why(spot)}`, { class: "verdict" }));
      if (spot.mark === "failed" && spot.failure && spot.failure.log) {
        const href = `../${spot.failure.log.split("/").map(encodeURIComponent).join("/")}`;
        const p = element("p");
        p.append(element("a", "the failed build's log's end", { href, class: "log" }));
        box.append(p);
      }
      const asked = this.asked(spot, picks);
      if (asked !== null) box.append(element("p", asked, { class: "asked" }));
    }

    why(spot) {
      const failure = spot.failure;
      switch (spot.mark) {
        case "failed": {
          const step = failure.recipe ? `${failure.step} (${failure.recipe})` : failure.step;
          return `failed at ${step}, exit ${failure.exit_code}: ${failure.error}`;
        }
        case "planned":
          return "planned, not built yet";
        case "opt-in":
          return `opt-in, built only where named: ${spot.why.replace(/^opt-in: /, "")}`;
        default:
          return `not in the matrix (${spot.why})`;
      }
    }

    // How often installers asked for the recipe's project for this Python and platform, and
    // did not find it (the wants); null where no want is known at all.
    asked(spot, picks) {
      if (!this.data.wants.length) return null;
      const project = this.projectOf(spot.recipe);
      const matches = (w) =>
        normalize(w.project) === project && w.python === picks.python && String(w.platform).endsWith(picks.platform);
      const wants = this.data.wants.filter(matches);
      const times = wants.reduce((sum, w) => sum + Number(w.count), 0);
      if (!times) return `not asked for: no installer asked for ${project} on Python ${picks.python} ${picks.platform}`;
      const where = wants.map((w) => `${w.count} in ${w.channel} (${w.reason})`).join(", ");
      return `asked for ${times === 1 ? "once" : `${times} times`}: ${where}`;
    }

    // The project a recipe's wheels are of, from any of its files; else the recipe's name.
    projectOf(recipe) {
      const spot = this.data.spots.find((s) => s.recipe === recipe && s.files.length);
      return spot ? parseWheel(spot.files[0].filename).project : normalize(recipe);
    }

    link(query) {
      const p = element("p", "A link to this answer: ", { class: "link" });
      p.append(element("a", `?${query}`, { href: `?${query}` }));
      return p;
    }
  }

  function start(data) {
    const section = document.getElementById("finder");
    const form = document.getElementById("picks");
    const finder = new Finder(data, form, document.getElementById("answer"));
    const query = new URLSearchParams(window.location.search);
    finder.show(Object.fromEntries(PICKS.map((name) => [name, query.get(name)])));
    form.addEventListener("change", () => finder.show(finder.picked()));
    section.hidden = false;
  }

  function fail(error) {
    const answer = document.getElementById("answer");
    answer.replaceChildren(element("p", `The finder could not read coverage.json: ${error}`, { class: "note" }));
    answer.dataset.ready = "1";
    document.getElementById("finder").hidden = false;
  }

  document.addEventListener("DOMContentLoaded", () => {
    fetch("coverage.json", { cache: "no-cache" })
      .then((response) => {
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        return response.json();
      })
      .then(start)
      .catch(fail);
  });
})();
