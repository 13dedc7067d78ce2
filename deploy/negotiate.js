// PEP 691 content negotiation for the nginx configs beside this file (nginx's njs module),
// the same rules as `wheelmill index serve` (src/wheelmill/index/serve.py, negotiate): the
// ?format= query first, then the Accept header's media ranges by quality, then by their
// order, the "latest" aliases read as v1; q=0 refuses a type. The chosen media type, or ""
// where the client accepts nothing the index serves (the configs answer 406).
//
// One table of Accept headers keeps the two the same (tests/data/accept.toml).

var JSON_TYPE = "application/vnd.pypi.simple.v1+json";
var HTML_TYPE = "application/vnd.pypi.simple.v1+html";
// In the server's order of preference when the client accepts several equally.
var OFFERED = [JSON_TYPE, HTML_TYPE, "text/html"];
var LATEST = {
    "application/vnd.pypi.simple.latest+json": JSON_TYPE,
    "application/vnd.pypi.simple.latest+html": HTML_TYPE,
};

function quality(params) {
    var q = 1.0;
    for (var i = 0; i < params.length; i++) {
        var eq = params[i].indexOf("=");
        var key = (eq < 0 ? params[i] : params[i].slice(0, eq)).trim();
        if (key === "q") {
            // Number() reads "" as 0, and anything else it cannot read as NaN: either refuses
            // the type, as a q index serve cannot read does.
            var value = Number(eq < 0 ? "" : params[i].slice(eq + 1));
            q = isNaN(value) ? 0.0 : value;
        }
    }
    return q;
}

function matches(range, offered) {
    if (range === offered || range === "*/*") {
        return true;
    }
    return range.endsWith("/*") && offered.startsWith(range.slice(0, -1));
}

function chosen(accept, format) {
    if (format) {
        format = LATEST[format] || format;
        return OFFERED.indexOf(format) >= 0 ? format : "";
    }
    if (!accept) {
        return "text/html";
    }
    var ranked = [];
    accept.split(",").forEach(function (part, position) {
        var params = part.split(";").map(function (p) { return p.trim(); });
        var media = params.shift().toLowerCase();
        var q = quality(params);
        if (q > 0) {
            ranked.push({q: q, position: position, media: LATEST[media] || media});
        }
    });
    ranked.sort(function (a, b) { return (b.q - a.q) || (a.position - b.position); });
    for (var i = 0; i < ranked.length; i++) {
        for (var j = 0; j < OFFERED.length; j++) {
            if (matches(ranked[i].media, OFFERED[j])) {
                return OFFERED[j];
            }
        }
    }
    return "";
}

// The query's format= as sent: "+" raw or percent-encoded; a raw "+" means itself here
// (media types have no spaces), as it does to `wheelmill index serve`.
function queryFormat(args) {
    var found = null;
    args.split("&").forEach(function (pair) {
        var eq = pair.indexOf("=");
        if (found === null && eq >= 0 && pair.slice(0, eq) === "format") {
            var raw = pair.slice(eq + 1).replace(/\+/g, "%2B");
            try {
                found = decodeURIComponent(raw);
            } catch (e) {
                found = raw;
            }
        }
    });
    return found;
}

function format(r) {
    return chosen(r.headersIn["Accept"] || "", queryFormat(r.variables.args || ""));
}

export default {format};
