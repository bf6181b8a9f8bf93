// GaussianSplats3D's own .ksplat writer (@mkkellogg/gaussian-splats-3d), as its util/create-ksplat.js runs it,
// keeping every splat (alpha removal threshold 0), for tests/test_format_tools.py and the fixtures in tests/data.
//   node ksplat.mjs IN.ply OUT.ksplat LEVEL SH_DEGREE
import * as GaussianSplats3D from '@mkkellogg/gaussian-splats-3d';
import * as fs from 'fs';

const [input, output, level, shDegree] = process.argv.slice(2);
const file = fs.readFileSync(input);
const buffer = file.buffer.slice(file.byteOffset, file.byteOffset + file.byteLength);
const splats = GaussianSplats3D.PlyParser.parseToUncompressedSplatArray(buffer, parseInt(shDegree));
const generator = GaussianSplats3D.SplatBufferGenerator.getStandardGenerator(0, parseInt(level), 0, undefined, 5.0, 256);
fs.writeFileSync(output, Buffer.from(generator.generateFromUncompressedSplatArray(splats).bufferData));
