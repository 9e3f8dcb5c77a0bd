#!/bin/bash
# pretraining variants in parallel, 3 members each, truncated to ROUNDS imitation rounds and no DQN steps
export PYTHONPATH=$PWD/src OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=
ROUNDS=${ROUNDS:-4}
python3 -c "import torch, numpy, scipy, yaml, rich, cloudpickle, psutil, pyarrow, matplotlib; print(torch.__version__, numpy.__version__)"
nproc
run() {  # name, args...
  local name=$1; shift
  /usr/bin/time -f "$name wall %e s" timeout 555 python3 -c 'import sys; from intune.cli import main; sys.argv[0]="intune"; sys.exit(main())' \
    pretrain --seed 0 --members 3 --keep best --jobs 3 --remote-share 0.25 --waiting-share 0.25 --decision mean \
    --rounds $ROUNDS --steps 0 --out $OUT/$name.pt "$@" > /tmp/$name.log 2>&1
  echo "rc $?" >> /tmp/$name.log
}
run w1 --waiting-gil-share 0.5 --regret-weight 1.0 &
run w03 --waiting-gil-share 0.5 --regret-weight 0.3 &
run w3 --waiting-gil-share 0.5 --regret-weight 3.0 &
run nogil --waiting-gil-share 0 --regret-weight 1.0 &
run holds --waiting-gil-share 0.5 --regret-weight 1.0 --weigh-holds &
( while sleep 60; do date +%T; tail -qn1 /tmp/*.log; done ) &
wait %1 %2 %3 %4 %5
for f in /tmp/w1.log /tmp/w03.log /tmp/w3.log /tmp/nogil.log /tmp/holds.log; do echo "== $f"; cat $f; done > $OUT/logs.txt
cat $OUT/logs.txt | grep -v "dagger round" 
