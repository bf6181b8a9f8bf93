// Niantic's SPZ library (@adobe/spz, its WebAssembly build) on a file, for tests/test_spz_interop.py.
//   node spz.mjs decode IN.spz OUT.json      the GaussianCloud it decodes, in the PLY's axes (to: RDF)
//   node spz.mjs encode IN.json OUT.spz V    a GaussianCloud (such arrays, RDF) saved as version V (from: RDF)
import createSpzModule from '@adobe/spz';
import * as fs from 'fs';

const [mode, input, output, version] = process.argv.slice(2);
const spz = await createSpzModule();
const RDF = spz.CoordinateSystem.RDF;
const ARRAYS = ['positions', 'scales', 'rotations', 'alphas', 'colors', 'sh'];

if (mode === 'decode') {
  const cloud = spz.loadSpzFromBuffer(new Uint8Array(fs.readFileSync(input)), { to: RDF });
  if (!cloud.numPoints) throw new Error(`${input}: Niantic's library decoded no splats`);
  const out = { numPoints: cloud.numPoints, shDegree: cloud.shDegree, antialiased: cloud.antialiased,
                extensions: Array.from(cloud.extensions, (e) => ({
                  type: e.extensionType.value,
                  coordinateSystem: e.coordinateSystem === undefined ? null : e.coordinateSystem.value })) };
  for (const k of ARRAYS) out[k] = Array.from(cloud[k]);
  fs.writeFileSync(output, JSON.stringify(out));
} else if (mode === 'encode') {
  const data = JSON.parse(fs.readFileSync(input, 'utf8'));
  const cloud = { numPoints: data.numPoints, shDegree: data.shDegree, antialiased: false, extensions: [] };
  for (const k of ARRAYS) cloud[k] = new Float32Array(data[k]);
  const bytes = spz.saveSpzToBuffer(cloud, { version: parseInt(version), from: RDF, sh1Bits: 5, shRestBits: 4 });
  if (!bytes.length) throw new Error("Niantic's library wrote nothing");
  fs.writeFileSync(output, bytes);
} else {
  throw new Error(`unknown mode ${mode}`);
}
