// The mechanism behind the OptionalDataException, without Spark: two threads put the same new
// keys into one java.util.HashMap at once (as two streaming queries' PythonStreamingSourceRunner
// .init() do on the environment map their Python data source's tasks all share), then the map
// is serialized and read back, as Spark ships it inside every task of that source.
//
//     javac -d /tmp EnvMapRace.java && java -cp /tmp EnvMapRace 20000 2 [concurrent]
//
// With `concurrent` the map is a ConcurrentHashMap (the mitigation): no failure is possible.
import java.io.*;
import java.util.*;
import java.util.concurrent.CyclicBarrier;

public class EnvMapRace {
    // the keys Spark 4.x's PythonStreamingSourceRunner.init() puts, in its order
    static final String[] KEYS = {
        "SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_PYTHON_RUNTIME"
    };

    static String roundTrip(Map<String, String> env) throws IOException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
            out.writeObject(env);
            out.writeObject("the rest of the task");  // a task has more after the map
        }
        try (ObjectInputStream in =
                new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
            in.readObject();
            in.readObject();
            return null;
        } catch (ObjectStreamException | ClassNotFoundException e) {
            return e.getClass().getName();
        }
    }

    public static void main(String[] args) throws Exception {
        int trials = args.length > 0 ? Integer.parseInt(args[0]) : 20000;
        int threads = args.length > 1 ? Integer.parseInt(args[1]) : 2;
        boolean concurrent = args.length > 2 && args[2].equals("concurrent");
        int poisoned = 0;
        Map<String, Integer> failures = new TreeMap<>();
        for (int t = 0; t < trials; t++) {
            Map<String, String> env =
                concurrent ? new java.util.concurrent.ConcurrentHashMap<>() : new HashMap<>();
            env.put("PYTHONHASHSEED", "0");  // what PySpark's register() puts there
            CyclicBarrier gate = new CyclicBarrier(threads);
            Thread[] starts = new Thread[threads];
            for (int i = 0; i < threads; i++) {
                starts[i] = new Thread(() -> {
                    try {
                        gate.await();
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                    for (String key : KEYS) {
                        env.put(key, key.toLowerCase());
                    }
                });
                starts[i].start();
            }
            for (Thread s : starts) {
                s.join();
            }
            int entries = 0;
            for (String key : env.keySet()) {
                entries++;
            }
            if (env.size() != entries) {
                poisoned++;
            }
            String failure = roundTrip(env);
            if (failure != null) {
                failures.merge(failure, 1, Integer::sum);
            }
        }
        System.out.printf(
            "%s, trials %d, threads %d: size() wrong in %d, deserialization failed in %d %s%n",
            concurrent ? "ConcurrentHashMap" : "HashMap", trials, threads, poisoned, failures.values().stream().mapToInt(i -> i).sum(), failures);
    }
}
